"""Autograde collected submissions: the judge scores, nbgrader keeps the books.

Per submission: nbgrader's autograde, without executing anything, restores the locked and
hidden test cells into a canonical copy; the judge (:mod:`ptcourse.judge.judge`, a fresh
process) runs that copy cell by cell, the student's code in a sandboxed worker and the judged
checks in itself; nbgrader's autograde then reads the judged copy's outputs into the gradebook,
again without executing anything. The two bookkeeping steps run no student code, so they run
here through nbgrader's API (a ``nbgrader`` process each cost 3 s of start-up per submission);
the judge is a subprocess with a deadline, so one student's crashing or hanging notebook can
only cost that submission, never the grading run.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptcourse.assets.datasets import data_root
from ptcourse.core.lineup import Lab
from ptcourse.course import intake
from ptcourse.course import lanes as lanes_of
from ptcourse.course.paths import BUILD, NBGRADER_DB, ROOT, course_labs
from ptcourse.course.release import nbgrader_api, release


def _run(command: list[str], timeout: float | None) -> subprocess.CompletedProcess[str]:
    """A grading step with a deadline; what it prints is decoded whatever the student wrote."""
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, errors="replace", timeout=timeout
    )


def _books(the_lab: Lab, student: str, submitted: Path, *, judged: bool) -> None:
    """nbgrader's autograde of ``submitted/<student>/<lab>``, executing nothing: the canonical
    copy (``judged=False``), or the judged copy's outputs read into the gradebook."""
    from sqlalchemy.exc import SAWarning

    api = nbgrader_api(BUILD / "nbgrader" / "release")
    api.coursedir.submitted_directory = str(submitted)
    api.config.Execute.enabled = False
    api.config.ClearOutput.enabled = not judged
    with BOOKS, warnings.catch_warnings():
        # nbgrader's own session use makes SQLAlchemy warn on every first submission
        warnings.filterwarnings("ignore", category=SAWarning)
        done = api.autograde(the_lab.name, student, force=True, create=True)
    if not done["success"]:  # its error is a traceback ending "Please see the above traceback"
        notebook = submitted / student / the_lab.name / f"{the_lab.name}.ipynb"
        raise StepFailed(intake.nbgrader_failure(the_lab, done.get("log", ""), notebook))


@dataclass
class Score:
    student: str
    lab: str
    status: str  # graded | missing | failed
    auto_score: float = 0.0
    auto_max: float = 0.0
    written_max: float = 0.0
    cells: dict[str, float] = field(default_factory=dict)
    detail: str = ""
    seconds: float = 0.0  # wall time of this submission's grading (books and judge)


def _scores_from_gradebook(the_lab: Lab, student: str) -> Score:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{NBGRADER_DB}") as gradebook:
        submission = gradebook.find_submission_notebook(the_lab.name, the_lab.name, student)
        cells = {
            g.name: float(g.score)
            for g in sorted(submission.grades, key=lambda g: g.name)
            if g.cell_type == "code"
        }
        return Score(
            student,
            the_lab.name,
            "graded",
            float(submission.code_score),
            float(submission.max_code_score),
            float(submission.max_written_score),
            cells,
        )


def autograde(
    submissions: Path,
    keys: list[str] | tuple[str, ...] = (),
    timeout_s: float = 3600,
    lanes: int = 1,
    remote: RemoteJudge | None = None,
) -> list[Score]:
    """Autograde ``submissions/<student>/<lab>/<lab>.ipynb`` for each lab and student.

    ``lanes`` > 1 judges that many submissions at once, each lane's judge and worker pinned to
    its own cores (:mod:`ptcourse.course.lanes`); nbgrader's bookkeeping steps take turns. With
    ``remote`` (a cluster's judge, :func:`ptcourse.course.cluster.dask_judge`) the judge steps
    run there, ``lanes`` at once, and the books stay here, in the one gradebook.

    A bad ``submissions`` folder or lab key raises a CourseInputError before any work; a handed-in
    file that is not this lab's notebook is graded "failed" unrun, and a missing one says where it
    seems to be instead, each in one line (:mod:`ptcourse.course.intake`).
    """
    students = intake.students(submissions)  # or a CourseInputError that says what is wrong
    submissions = submissions.resolve()
    labs = course_labs(keys)  # or an UnknownLab
    for line in intake.strays(submissions, students):
        print(line, file=sys.stderr)
    private_release = BUILD / "nbgrader" / "release"
    release(keys, release_dir=private_release)  # registers each lab in the gradebook
    jobs = [(each, student) for each in labs for student in students]
    plan = lanes_of.this_machine(lanes) if remote is None else [[]] * lanes

    def grade(job: tuple[Lab, str], cores: list[int]) -> Score:
        each, student = job
        if not (submissions / student / each.name / f"{each.name}.ipynb").exists():
            where = intake.whereabouts(each, submissions / student)
            return Score(student, each.name, "missing", detail=where)
        start = time.perf_counter()
        pinned = cores if lanes > 1 and remote is None else None
        score = _autograde_one(each, student, submissions, timeout_s, pinned, remote)
        score.seconds = round(time.perf_counter() - start, 1)
        return score

    with _progress(len(jobs)) as done:
        scores = lanes_of.run_in_lanes(jobs, grade, plan, done)
    _feedback(scores, private_release)
    return scores


@contextlib.contextmanager
def _progress(total: int) -> Iterator[Callable[[Score, int, int], None]]:
    """One line per graded submission as it finishes (a class takes hours), under a progress bar
    where stderr is a terminal."""
    from tqdm import tqdm

    bar = tqdm(total=total, desc="graded", unit="submission", disable=not sys.stderr.isatty())

    def done(s: Score, count: int, total: int) -> None:
        points = f"{s.auto_score:g}/{s.auto_max:g}" if s.status == "graded" else s.status
        bar.write(f"[{count}/{total}] {s.student}/{s.lab}: {points} in {s.seconds:.0f} s")
        bar.update()

    try:
        yield done
    finally:
        bar.close()


def _feedback(scores: list[Score], release_dir: Path) -> None:
    """Feedback HTML for every graded submission, in one process (hidden tests stay hidden)."""
    api = nbgrader_api(release_dir)
    for s in scores:
        if s.status == "graded":
            done = api.generate_feedback(s.lab, s.student, force=True)
            if not done["success"]:
                s.detail = f"no feedback: {done['error'].strip().splitlines()[-1][:200]}"


BOOKS = threading.Lock()  # nbgrader's gradebook is one sqlite file: its steps take turns


# A judge step run elsewhere (:mod:`ptcourse.course.cluster`): (lab, canonical notebook, the
# student's folder, where the judged notebook goes, deadline); raises StepFailed on failure.
RemoteJudge = Callable[[Lab, Path, Path, Path, float], None]


def _autograde_one(
    the_lab: Lab,
    student: str,
    submissions: Path,
    timeout_s: float,
    cores: list[int] | None = None,
    remote: RemoteJudge | None = None,
) -> Score:
    name = f"{the_lab.name}.ipynb"
    raw = submissions / student / the_lab.name
    judged = BUILD / "judge" / "submitted" / student / the_lab.name
    try:
        refused = intake.refusal(the_lab, raw / name)  # not a notebook, or not this lab's
        if refused:
            return Score(student, the_lab.name, "failed", detail=refused)
        _books(the_lab, student, submissions, judged=False)
        canonical = BUILD / "nbgrader" / "autograded" / student / the_lab.name / name
        judged.mkdir(parents=True, exist_ok=True)
        # nbgrader's exchange (release_feedback) needs the submission's secret in the feedback
        for extra in [*raw.glob("timestamp.txt"), *raw.glob("submission_secret.txt")]:
            shutil.copyfile(extra, judged / extra.name)
        if remote is None:
            _step(_judge(the_lab, canonical, raw, judged / name, timeout_s, cores))
        else:
            remote(the_lab, canonical, raw, judged / name, timeout_s)
        _books(the_lab, student, judged.parents[1], judged=True)
    except subprocess.TimeoutExpired:
        return Score(student, the_lab.name, "failed", detail=f"grading exceeded {timeout_s:.0f} s")
    except StepFailed as failed:
        return Score(student, the_lab.name, "failed", detail=str(failed))
    except Exception as error:  # one submission's surprise must not end everyone's grading
        traceback.print_exc()
        return Score(student, the_lab.name, "failed", detail=f"grading error: {error!r}")
    return _scores_from_gradebook(the_lab, student)


class StepFailed(RuntimeError):
    pass


def _step(done: subprocess.CompletedProcess[str]) -> None:
    if done.returncode != 0:
        raise StepFailed(done.stderr.strip()[-500:])


def _judge(
    the_lab: Lab,
    canonical: Path,
    submission: Path,
    out: Path,
    timeout_s: float,
    cores: list[int] | None,
) -> subprocess.CompletedProcess[str]:
    """One fresh judge process (pinned to ``cores``, which its worker inherits): BUILD and the
    submissions folder are hidden from the worker."""
    scratch = BUILD / "judge" / "scratch" / out.parent.parent.name / the_lab.name
    shutil.rmtree(scratch, ignore_errors=True)
    # The checkout's own build folder too, where BUILD is a folder of its own (ptcourse check):
    # an instructor's gradebook and other students' judged notebooks live there.
    hidden = os.pathsep.join(sorted(map(str, {BUILD, ROOT / "build", submission.parents[1]})))
    readable = os.pathsep.join(
        str(Path(p).resolve()) for p in (ROOT, sys.prefix, sys.base_prefix, data_root())
    )
    command = [sys.executable, "-m", "ptcourse.judge.judge", the_lab.number, str(canonical)]
    command += [str(submission), str(scratch), str(out), hidden, readable]
    return _run(lanes_of.pinned(command, cores), timeout_s)


def write_grades_csv(scores: list[Score], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["student", "lab", "status", "autograded", "autograded_max", "written_max", "seconds"]
            + ["detail"]
        )
        for s in scores:
            writer.writerow(
                [s.student, s.lab, s.status, s.auto_score, s.auto_max, s.written_max, s.seconds]
                + [_last_line(s.detail)]
            )
    return path


def write_grades_json(scores: list[Score], path: Path) -> Path:
    """Every score with its per-cell points, for scripts and the tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(s) for s in scores], indent=2))
    return path


def score_table(scores: list[Score]) -> str:
    lines = [f"{'student':<16}{'lab':<24}{'status':<9}{'autograded':>12}{'time':>8}  written"]
    for s in scores:
        auto = f"{s.auto_score:g}/{s.auto_max:g}" if s.status == "graded" else "—"
        note = f"  {_last_line(s.detail)}" if s.detail else ""
        lines.append(
            f"{s.student:<16}{s.lab:<24}{s.status:<9}{auto:>12}{s.seconds:7.0f}s  "
            f"{s.written_max:g} pts{note}"
        )
    return "\n".join(lines)


def _last_line(detail: str) -> str:
    """A score's detail in one line: its last (a refusal is one line; a judge's error ends with
    its exception)."""
    lines = detail.strip().splitlines()
    return lines[-1][:300] if lines else ""


def copy_submission(source: Path, submissions: Path, student: str, the_lab: Lab) -> Path:
    """Place a notebook where ``autograde`` expects it (used by tests and instructors' scripts)."""
    target = submissions / student / the_lab.name / f"{the_lab.name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target
