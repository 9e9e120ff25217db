"""Execute lab notebooks with papermill into the build folder, collecting graded results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptcourse.core import attained, hardware
from ptcourse.core.lineup import Lab
from ptcourse.course import lanes as lanes_of
from ptcourse.course.paths import BUILD, notebook
from ptcourse.grading import checks


@dataclass
class LabRun:
    """One executed notebook, for the report card."""

    lab: str
    title: str
    track: str
    track_reason: str
    device: str
    ok: bool
    seconds: float
    output: str
    error: str = ""
    results: list[dict] = field(default_factory=list)
    attained: list[dict] = field(default_factory=list)  # roofline points (core.attained)


# ipykernel warns on every start that its local TCP transport is unencrypted: noise on a
# machine's loopback, and it buried the run's own lines. Cell outputs are not affected.
QUIET_KERNEL = ["--IPKernelApp.log_level=ERROR"]


def _read_results(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def execute(the_lab: Lab, smoke: bool, folder: str = "solutions") -> LabRun:
    """Run one notebook with papermill into build/run/, collecting its graded results."""
    import papermill

    out_dir = BUILD / "run" / folder / the_lab.name
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    results.unlink(missing_ok=True)
    output = out_dir / f"{the_lab.name}.ipynb"
    points = out_dir / "attained.jsonl"
    points.unlink(missing_ok=True)
    os.environ[checks.RESULTS_ENV] = str(results)  # the kernel inherits it
    os.environ[attained.ENV] = str(points)
    os.environ["PTCOURSE_SMOKE"] = "1" if smoke else "0"
    track = hardware.track_for(the_lab)
    start, error = time.perf_counter(), ""
    try:
        papermill.execute_notebook(
            str(notebook(the_lab, folder)),
            str(output),
            parameters={"SMOKE": smoke},
            cwd=str(out_dir),
            kernel_name="python3",
            progress_bar=sys.stderr.isatty(),
            extra_arguments=QUIET_KERNEL,
        )
    except Exception as failure:  # papermill's execution error names the failing cell
        error = str(failure).strip().splitlines()[-1][:500] if str(failure) else repr(failure)
    finally:
        os.environ.pop(checks.RESULTS_ENV, None)
        os.environ.pop(attained.ENV, None)
    return LabRun(
        lab=the_lab.name,
        title=the_lab.title,
        track=track.name,
        track_reason=track.reason,
        device=track.device,
        ok=not error,
        seconds=round(time.perf_counter() - start, 1),
        output=str(output),
        error=error,
        results=_read_results(results),
        attained=attained.read(points),
    )


def execute_in_lanes(
    labs: list[Lab],
    smoke: bool,
    folder: str,
    lanes: int,
    done: Callable[[LabRun, int, int], None] = lambda run, count, total: None,
) -> list[LabRun]:
    """:func:`execute` for every lab, ``lanes`` notebooks at once, each in a child process
    pinned to its lane's cores (its kernel inherits them); ``done`` as each finishes."""

    def in_lane(the_lab: Lab, cores: list[int]) -> LabRun:
        with tempfile.TemporaryDirectory() as folder_out:
            out = Path(folder_out) / "run.json"
            command = [sys.executable, "-m", "ptcourse.course.execute", the_lab.number, folder]
            command += ["--smoke"] * smoke + [str(out)]
            child = subprocess.run(
                lanes_of.pinned(command, cores), capture_output=True, text=True, errors="replace"
            )
            if out.exists():
                return LabRun(**json.loads(out.read_text()))
        track = hardware.track_for(the_lab)  # the child died before it could report
        error = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1][:500]
        return LabRun(the_lab.name, the_lab.title, track.name, track.reason, track.device,
                      ok=False, seconds=0.0, output="", error=error)  # fmt: skip

    return lanes_of.run_in_lanes(labs, in_lane, lanes_of.this_machine(lanes), done)


def main(argv: list[str] | None = None) -> None:
    """``python -m ptcourse.course.execute LAB FOLDER [--smoke] OUT``: one lab's run (a lane of
    :func:`execute_in_lanes`), its :class:`LabRun` written to OUT as JSON."""
    from ptcourse.core.lineup import lab

    args = argv if argv is not None else sys.argv[1:]
    smoke = "--smoke" in args
    key, folder, out = [a for a in args if a != "--smoke"]
    Path(out).write_text(json.dumps(asdict(execute(lab(key), smoke=smoke, folder=folder))))


if __name__ == "__main__":
    main()
