"""The ``ptcourse`` command: doctor, data, release, run, grade, check, progress, answers, lab,
targets."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from ptcourse.core import smoke
from ptcourse.core.errors import CourseInputError


def _doctor(args: argparse.Namespace) -> int:
    from ptcourse.core import hardware
    from ptcourse.judge import accounting, sandbox

    print(hardware.doctor_report())
    missing = sandbox.unavailable()
    counted = accounting.for_sandbox(1)
    counted.release()
    where = "bubblewrap" if not missing else f"none: {missing}"
    print(f"  {'grading sandbox':<17}{where}; resources counted by {counted.kind}")
    return 0


def _data(args: argparse.Namespace) -> int:
    from ptcourse.assets import datasets

    size = args.smoke or smoke.is_smoke()
    names = args.names or ["inspection", "headlines"]
    for name in names:  # an unknown name is said before any dataset is built
        datasets.dataset_dir(name, smoke=size)
    for name in names:
        path = datasets.ensure(name, smoke=size)
        print(f"{name}: {path} verified ({datasets.manifest(name, smoke=size)['files']} files)")
    return 0


def _release(args: argparse.Namespace) -> int:
    from ptcourse.course import paths, release

    for path in release.release(args.labs):
        print(f"released {path.relative_to(paths.ROOT)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ptcourse.course import execute, paths, report

    size = args.smoke or smoke.is_smoke()
    folder = "labs" if args.labs_version else "solutions"
    labs = paths.course_labs(args.labs)  # or an UnknownLab, said in one line by main()
    mode = "smoke sizes" if size else "full sizes"
    if not size:
        from ptcourse.core import estimate

        print(estimate.run_plan([each.number for each in labs], args.lanes))
    bar = tqdm(total=len(labs), desc="labs", unit="lab", disable=not sys.stderr.isatty())

    def done(run: execute.LabRun, count: int, total: int) -> None:
        verdict = "ok" if run.ok else f"FAILED ({run.error})"
        met = sum(r["points"] >= r["max_points"] for r in run.results)
        bar.write(
            f"{run.lab:<24} {run.track:<10} {run.seconds:6.1f} s  "
            f"{met}/{len(run.results)} targets met  {verdict}  [{count}/{total}]"
        )
        bar.update()

    if args.lanes > 1:
        bar.write(f"running {len(labs)} labs ({folder}, {mode}) in {args.lanes} lanes …")
        runs = execute.execute_in_lanes(labs, size, folder, args.lanes, done)
    else:
        runs = []
        for each in labs:
            bar.write(f"running {each.name} ({len(runs) + 1}/{len(labs)}, {folder}, {mode}) …")
            runs.append(execute.execute(each, smoke=size, folder=folder))
            done(runs[-1], len(runs), len(labs))
    bar.close()
    from ptcourse.core import measure

    print("measuring this machine's ceilings for the report card …")
    ceilings = measure.ceilings(threads=1)
    json_path, html_path = report.write(runs, paths.BUILD / "report", size, ceilings)
    print(f"report card: {html_path} (and {json_path.name})")
    return 0 if all(r.ok for r in runs) else 1


def _grade(args: argparse.Namespace) -> int:
    from ptcourse.course import autograde, intake, paths

    submissions = Path(args.submissions)
    intake.students(submissions)  # a bad folder or lab is said before any work starts
    paths.course_labs(args.labs)
    if args.cluster:
        from ptcourse.course import cluster

        with cluster.connect(args.cluster) as client:
            lanes = cluster.lanes_of(client)
            if lanes < 1:
                print("the cluster's workers offer no 'lane': start each with --resources lane=1")
                return 2
            print(f"judging on the Dask cluster at {args.cluster}: {lanes} lane(s)")
            scores = autograde.autograde(
                submissions, args.labs, args.timeout, lanes, remote=cluster.dask_judge(client)
            )
    else:
        scores = autograde.autograde(submissions, args.labs, args.timeout, args.lanes)
    print(autograde.score_table(scores))
    csv_path = autograde.write_grades_csv(scores, paths.BUILD / "grades" / "grades.csv")
    autograde.write_grades_json(scores, csv_path.with_suffix(".json"))
    print(f"grades: {csv_path} (per-cell points in grades.json)")
    print(f"feedback: {paths.BUILD / 'nbgrader' / 'feedback'}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from ptcourse.course import selfcheck

    if args.smoke:
        smoke.set_smoke(True)  # the grading child and its judge inherit it
    goals = selfcheck.targets(args.labs)  # bad input is said before any grading starts
    size = (
        "smoke size" if smoke.is_smoke() else "full size (as long as running it; --smoke: a minute)"
    )
    graded = True
    for goal in goals:
        where = _shown(goal.notebook)
        print(
            f"checking Lab {goal.lab.number} ({where}) at {size} in the judge's sandbox …",
            flush=True,
        )
        checked = selfcheck.check(goal, args.timeout)
        selfcheck.record(checked)
        print(selfcheck.report(checked), flush=True)
        graded = graded and checked.status == "graded"
    return 0 if graded else 1


def _shown(path: Path) -> str:
    """A path relative to the current folder where it lies below it (labs/04-…/04-….ipynb)."""
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _progress(args: argparse.Namespace) -> int:
    from ptcourse.course import selfcheck

    print(selfcheck.progress_table())
    print(f"(autograded points per lab, from {selfcheck.progress_file()})")
    return 0


def _answers(args: argparse.Namespace) -> int:
    from ptcourse.course import selfcheck

    print(selfcheck.answers(args.lab))
    return 0


def _lab(args: argparse.Namespace) -> int:
    from ptcourse.assets import datasets
    from ptcourse.course import paths

    size = args.smoke or smoke.is_smoke()
    for name in ("inspection", "headlines"):
        datasets.ensure(name, smoke=size)
    jupyter = shutil.which("jupyter", path=os.path.dirname(sys.executable)) or "jupyter"
    command = [jupyter, "lab", str(paths.ROOT / "labs"), *args.jupyter_args]
    os.execv(jupyter, command)
    return 0  # not reached


def _targets(args: argparse.Namespace) -> int:
    from ptcourse import labs
    from ptcourse.grading import targets

    print(targets.table_markdown(labs.all_targets()))
    return 0


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number above zero (``--lanes 0`` or ``--timeout -1`` is refused)."""

    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            what = "whole number" if kind is int else "number"
            raise argparse.ArgumentTypeError(f"{text!r} is not a {what} above 0")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(
        prog="ptcourse", description="A graded course on making PyTorch fast."
    )
    sub = main.add_subparsers(dest="command", required=True)

    p = sub.add_parser("doctor", help="what this machine offers and which track each lab runs")
    p.set_defaults(func=_doctor)

    p = sub.add_parser("data", help="build (if missing or corrupt) and verify the datasets")
    p.add_argument("names", nargs="*", metavar="NAME", help="inspection, headlines (both)")
    p.add_argument("--smoke", action="store_true", help="the small smoke-size datasets")
    p.set_defaults(func=_data)

    p = sub.add_parser("release", help="regenerate labs/ from solutions/ with nbgrader")
    p.add_argument("labs", nargs="*", metavar="LAB", help="e.g. 00 or 01-data-loading (all)")
    p.set_defaults(func=_release)

    p = sub.add_parser("run", help="execute labs with papermill and write the report card")
    p.add_argument("labs", nargs="*", metavar="LAB", help="e.g. 00 or 01-data-loading (all)")
    p.add_argument("--smoke", action="store_true", help="shrunk sizes: each lab in about a minute")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--solutions", action="store_true", help="run solutions/ (default)")
    which.add_argument("--labs", dest="labs_version", action="store_true", help="run labs/")
    p.add_argument(
        "--lanes",
        type=_positive(int),
        default=1,
        help="notebooks run at once, each on its own cores (1; at most one per core)",
    )
    p.set_defaults(func=_run)

    p = sub.add_parser("grade", help="autograde SUBMISSIONS/<student>/<lab>/<lab>.ipynb")
    p.add_argument("submissions", metavar="SUBMISSIONS_DIR")
    p.add_argument("labs", nargs="*", metavar="LAB", help="labs to grade (all)")
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=3600,
        help="seconds allowed per submission (3600)",
    )
    p.add_argument(
        "--lanes",
        type=_positive(int),
        default=1,
        help="submissions judged at once, each on its own cores (1; at most one per core)",
    )
    p.add_argument(
        "--cluster",
        metavar="ADDRESS",
        help="judge on a Dask cluster (tcp://scheduler:8786, or 'local' for one local worker); "
        "its workers' lanes replace --lanes, the gradebook stays here",
    )
    p.set_defaults(func=_grade)

    p = sub.add_parser(
        "check", help="grade your own notebook with the judge (no gradebook or instructor needed)"
    )
    p.add_argument(
        "labs",
        nargs="*",
        metavar="LAB|NOTEBOOK",
        help="a lab (04: its notebook in labs/) or a notebook's path; none: each lab in labs/ "
        "you have edited",
    )
    p.add_argument("--smoke", action="store_true", help="shrunk sizes: each lab in about a minute")
    p.add_argument(
        "--timeout",
        type=_positive(float),
        default=3600,
        help="seconds allowed per notebook (3600)",
    )
    p.set_defaults(func=_check)

    p = sub.add_parser("progress", help="your checked labs' points: best and last check")
    p.set_defaults(func=_progress)

    p = sub.add_parser("answers", help="a checked lab's model answers, rubrics and solution code")
    p.add_argument("lab", metavar="LAB", help="e.g. 04 or 04-grad-accumulation")
    p.set_defaults(func=_answers)

    p = sub.add_parser("lab", help="build the datasets, then start JupyterLab on labs/")
    p.add_argument("--smoke", action="store_true", help="build only the small smoke datasets")
    p.add_argument("jupyter_args", nargs=argparse.REMAINDER, help="passed to jupyter lab")
    p.set_defaults(func=_lab)

    p = sub.add_parser("targets", help="print the graded targets table")
    p.set_defaults(func=_targets)
    return main


def main(argv: list[str] | None = None) -> int:
    commands = parser()
    # argparse hands a REMAINDER nothing that starts with "-" when it comes first, so
    # `ptcourse lab --allow-root` would be refused: jupyter's own options pass through here
    args, unknown = commands.parse_known_args(argv)
    if unknown and args.func is not _lab:
        commands.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.func is _lab:
        args.jupyter_args = [a for a in [*unknown, *args.jupyter_args] if a != "--"]
    try:
        return args.func(args)
    except CourseInputError as error:  # bad input is said in one line, never a traceback
        print(f"{commands.prog}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
