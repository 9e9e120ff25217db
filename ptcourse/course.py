"""The course as a whole: which labs exist, release, execution with papermill, autograding.

nbgrader steps run as subprocesses (one per lab or submission) so that one student's crashing
or hanging notebook can only cost that submission, never the grading run.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ptcourse import grade, hardware
from ptcourse.labs import LABS, Lab, lab

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / os.environ.get("PTCOURSE_BUILD", "build")  # relative to ROOT, or absolute
NBGRADER_DB = BUILD / "nbgrader" / "gradebook.db"


def notebook(the_lab: Lab, folder: str = "solutions") -> Path:
    return ROOT / folder / the_lab.name / f"{the_lab.name}.ipynb"


def course_labs(keys: list[str] | tuple[str, ...] = ()) -> list[Lab]:
    """The labs named by ``keys`` (all written labs when empty)."""
    chosen = [lab(key) for key in keys] if keys else list(LABS)
    missing = [each.name for each in chosen if keys and not notebook(each).exists()]
    if missing:
        raise SystemExit(f"not written yet: {', '.join(missing)}")
    return [each for each in chosen if notebook(each).exists()]


def _nbgrader(*args: str, timeout: float | None = None) -> subprocess.CompletedProcess[str]:
    NBGRADER_DB.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "nbgrader", *args]
    return subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
    )


def _api(release_dir: Path | None = None):  # -> nbgrader.apps.NbGraderAPI
    """nbgrader's Python API with the course's config: one process for many steps (a CLI call
    per step costs seconds of start-up each)."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config.loader import PyFileConfigLoader

    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    if release_dir is not None:
        config.CourseDirectory.release_directory = str(release_dir)
    return NbGraderAPI(coursedir=CourseDirectory(config=config), config=config)


def release(keys: list[str] | tuple[str, ...] = (), release_dir: Path | None = None) -> list[Path]:
    """Regenerate the student version of each lab (labs/ unless ``release_dir``) with nbgrader."""
    api, written = _api(release_dir), []
    for each in course_labs(keys):
        done = api.generate_assignment(each.name, force=True)
        if not done["success"]:
            raise RuntimeError(f"nbgrader could not release {each.name}:\n{done['error'][-2000:]}")
        written.append((release_dir or ROOT / "labs") / each.name / f"{each.name}.ipynb")
    return written


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
    os.environ[grade.RESULTS_ENV] = str(results)  # the kernel inherits it
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
        )
    except Exception as failure:  # papermill's execution error names the failing cell
        error = str(failure).strip().splitlines()[-1][:500] if str(failure) else repr(failure)
    finally:
        os.environ.pop(grade.RESULTS_ENV, None)
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
    )


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
    submissions: Path, keys: list[str] | tuple[str, ...] = (), timeout_s: float = 3600
) -> list[Score]:
    """Autograde ``submissions/<student>/<lab>/<lab>.ipynb`` for each lab and student."""
    submissions = submissions.resolve()
    students = sorted(p.name for p in submissions.iterdir() if p.is_dir())
    private_release = BUILD / "nbgrader" / "release"
    release(keys, release_dir=private_release)  # registers each lab in the gradebook
    where = f"--CourseDirectory.submitted_directory={submissions}"
    scores = []
    for each in course_labs(keys):
        for student in students:
            if not (submissions / student / each.name / f"{each.name}.ipynb").exists():
                scores.append(Score(student, each.name, "missing"))
                continue
            scores.append(_autograde_one(each, student, where, timeout_s))
    _feedback(scores, private_release)
    return scores


def _feedback(scores: list[Score], release_dir: Path) -> None:
    """Feedback HTML for every graded submission, in one process (hidden tests stay hidden)."""
    api = _api(release_dir)
    for s in scores:
        if s.status == "graded":
            done = api.generate_feedback(s.lab, s.student, force=True)
            if not done["success"]:
                s.detail = f"no feedback: {done['error'].strip().splitlines()[-1][:200]}"


def _autograde_one(the_lab: Lab, student: str, where: str, timeout_s: float) -> Score:
    release_dir = f"--CourseDirectory.release_directory={BUILD / 'nbgrader' / 'release'}"
    args = [the_lab.name, "--student", student, "--force", where, release_dir]
    try:
        done = _nbgrader("autograde", *args, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Score(student, the_lab.name, "failed", detail=f"grading exceeded {timeout_s:.0f} s")
    if done.returncode != 0:
        return Score(student, the_lab.name, "failed", detail=done.stderr.strip()[-500:])
    return _scores_from_gradebook(the_lab, student)


def write_grades_csv(scores: list[Score], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "lab", "status", "autograded", "autograded_max", "written_max"])
        for s in scores:
            writer.writerow([s.student, s.lab, s.status, s.auto_score, s.auto_max, s.written_max])
    return path


def write_grades_json(scores: list[Score], path: Path) -> Path:
    """Every score with its per-cell points, for scripts and the tests."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([asdict(s) for s in scores], indent=2))
    return path


def score_table(scores: list[Score]) -> str:
    lines = [f"{'student':<16}{'lab':<24}{'status':<9}{'autograded':>12}  written (manual)"]
    for s in scores:
        auto = f"{s.auto_score:g}/{s.auto_max:g}" if s.status == "graded" else "—"
        note = f"  {s.detail.splitlines()[-1][:80]}" if s.detail else ""
        lines.append(
            f"{s.student:<16}{s.lab:<24}{s.status:<9}{auto:>12}  {s.written_max:g} pts{note}"
        )
    return "\n".join(lines)


def copy_submission(source: Path, submissions: Path, student: str, the_lab: Lab) -> Path:
    """Place a notebook where ``autograde`` expects it (used by tests and instructors' scripts)."""
    target = submissions / student / the_lab.name / f"{the_lab.name}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(source, target)
    return target
