"""A learner grades their own notebook: ``ptcourse check``, ``progress`` and ``answers``.

``ptcourse check [LAB | NOTEBOOK …]`` copies the notebook into a private submissions folder
(``BUILD/check/submissions/me/<lab>/<lab>.ipynb``) and runs ``ptcourse grade`` on it in a child
process whose ``PTCOURSE_BUILD`` is ``BUILD/check``: the same nbgrader steps, judge, sandbox and
hidden checks as an instructor's grading, with a gradebook of its own, so an instructor's
gradebook and ``ptcourse grade`` itself are untouched. It then prints, per graded cell, the
points and the judge's verdict lines (``[lab NN · …]``, which carry the target that applied on
this machine), and the feedback HTML's path, and appends one line per graded cell to
``BUILD/progress.jsonl``. Without arguments it checks every lab in ``labs/`` the learner has
touched: a notebook one of whose answer cells no longer matches the checksum nbgrader wrote into
it at release.

``ptcourse progress`` reads ``progress.jsonl`` into a table of labs × points (best and last
check); ``ptcourse answers LAB`` prints the instructors' model answers, rubrics and exercise
code from ``solutions/``, once that lab has been checked.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ptcourse.core import smoke
from ptcourse.core.errors import CourseInputError
from ptcourse.core.lineup import Lab, lab
from ptcourse.course import intake, paths

STUDENT = "me"  # the learner's folder in the private submissions tree
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
# How the judge's notes on a graded cell begin (ptcourse.judge.judge's UNSANDBOXED, PER_PROCESS)
JUDGE_NOTES = ("UNSANDBOXED", "PER-PROCESS ACCOUNTING")


# Which notebooks to check


@dataclass(frozen=True)
class Target:
    """A notebook to check, and the lab it is."""

    lab: Lab
    notebook: Path


def targets(args: list[str] | tuple[str, ...] = ()) -> list[Target]:
    """What ``ptcourse check ARGS`` checks: each lab key or notebook path named, or (none named)
    every lab in ``labs/`` the learner has touched; bad input is a CourseInputError."""
    if args:
        return [target(arg) for arg in args]
    found = touched_labs()
    if not found:
        raise CourseInputError(
            "nothing to check: no notebook in labs/ differs from its released copy — answer an "
            "exercise first, or name a lab (ptcourse check 04) or a notebook"
        )
    return [Target(each, paths.notebook(each, "labs")) for each in found]


def target(arg: str) -> Target:
    """A lab key (``04``, ``04-grad-accumulation``: its notebook in ``labs/``) or a notebook's
    path (its lab found from its nbgrader cell ids)."""
    path = Path(arg)
    if arg.endswith(".ipynb") or path.is_file():
        return Target(notebook_lab(path), path)
    the_lab = lab(arg)  # or an UnknownLab
    paths.course_labs([the_lab.number])  # or "not written yet"
    notebook = paths.notebook(the_lab, "labs")
    if not notebook.is_file():
        where = notebook.relative_to(paths.ROOT)
        raise CourseInputError(
            f"no notebook at {where}: restore it (git checkout {where}), or name your copy's path"
        )
    return Target(the_lab, notebook)


def notebook_lab(path: Path) -> Lab:
    """The lab whose notebook ``path`` is, or a CourseInputError in intake's words."""
    fresh = "start from a fresh copy of the lab's notebook in labs/ and paste your code into it"
    if not path.exists():
        raise CourseInputError(f"no such notebook: {path}")
    if not path.is_file():
        raise CourseInputError(f"not a file: {path} (name a notebook, or a lab: ptcourse check 04)")
    try:
        ids = intake.grade_ids(intake.read(path))
    except intake.NotANotebook as error:
        raise CourseInputError(f"{path} is not a notebook: {error} — {fresh}") from None
    found = intake.lab_of(ids)
    if found is not None:
        return found
    if not ids:
        raise CourseInputError(
            f"{path} has no nbgrader cell ids (made outside the lab's copy, or its cell metadata "
            f"cleared?) — {fresh}"
        )
    raise CourseInputError(
        f"{path} has none of any lab's cells (a notebook from elsewhere?) — {fresh}"
    )


def touched_labs(folder: Path | None = None) -> list[Lab]:
    """The written labs whose notebook in ``folder`` (``labs/``) the learner has touched."""
    folder = folder or paths.ROOT / "labs"
    chosen = paths.course_labs()
    return [each for each in chosen if touched(folder / each.name / f"{each.name}.ipynb")]


def touched(notebook: Path) -> bool:
    """Whether a released notebook has been edited: one of its answer cells (nbgrader's solution
    cells, code or written) no longer matches the checksum nbgrader stored in it at release.
    Running cells does not count (outputs are not in the checksum); a missing notebook is
    untouched, an unreadable one touched (checking it says what is wrong)."""
    if not notebook.is_file():
        return False
    import nbformat
    from nbgrader.utils import compute_checksum

    try:
        nb = nbformat.read(notebook, as_version=4)
        for cell in nb.cells:
            meta = cell.metadata.get("nbgrader", {})
            if meta.get("solution") and compute_checksum(cell) != meta.get("checksum"):
                return True
    except Exception:  # not JSON, not a notebook, cells without ids: not as released
        return True
    return False


# Checking one notebook


@dataclass
class CellResult:
    """One graded cell of a check: its points and the judge's verdict lines."""

    cell: str
    points: float
    max_points: float
    lines: list[str] = field(default_factory=list)


@dataclass
class Checked:
    """The outcome of one check: graded (with its cells and feedback) or failed (with why)."""

    lab: Lab
    notebook: Path
    status: str
    cells: list[CellResult] = field(default_factory=list)
    written_max: float = 0.0
    feedback: Path | None = None
    detail: str = ""

    @property
    def points(self) -> float:
        return sum(c.points for c in self.cells)

    @property
    def max_points(self) -> float:
        return sum(c.max_points for c in self.cells)


def check_folder() -> Path:
    """The private build folder of ``ptcourse check`` (its own gradebook and judged copies)."""
    return paths.BUILD / "check"


def check(goal: Target, timeout_s: float = 3600) -> Checked:
    """Grade a copy of ``goal``'s notebook as ``ptcourse grade`` does, in the private build
    folder; what is left there from an earlier check is not read."""
    from ptcourse.course import autograde

    folder = check_folder()
    submissions = folder / "submissions"
    name = f"{goal.lab.name}.ipynb"
    judged = folder / "judge" / "submitted" / STUDENT / goal.lab.name / name
    feedback = folder / "nbgrader" / "feedback" / STUDENT / goal.lab.name / name
    grades = folder / "grades" / "grades.json"
    for stale in (judged, feedback.with_suffix(".html"), grades):
        stale.unlink(missing_ok=True)
    autograde.copy_submission(goal.notebook, submissions, STUDENT, goal.lab)
    done = grade(submissions, goal.lab, folder, timeout_s)
    if not grades.is_file():
        why = _tail(done.stderr) or _tail(done.stdout) or f"exit status {done.returncode}"
        return Checked(goal.lab, goal.notebook, "failed", detail=f"grading failed: {why}")
    score = json.loads(grades.read_text())[0]
    if score["status"] != "graded":
        return Checked(goal.lab, goal.notebook, score["status"], detail=score["detail"])
    html = feedback.with_suffix(".html")
    return Checked(
        goal.lab,
        goal.notebook,
        "graded",
        cell_results(judged, score["cells"]),
        float(score["written_max"]),
        html if html.is_file() else None,
        score["detail"],
    )


def grade(
    submissions: Path, the_lab: Lab, folder: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    """``ptcourse grade SUBMISSIONS LAB`` in a child process whose build folder is ``folder``."""
    env = {**os.environ, "PTCOURSE_BUILD": str(folder.resolve())}
    command = [sys.executable, "-m", "ptcourse.course.cli", "grade", str(submissions)]
    command += [the_lab.number, "--timeout", f"{timeout_s:g}"]
    return subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, errors="replace"
    )


def cell_results(judged: Path, points: dict[str, float]) -> list[CellResult]:
    """Each autograded cell of the judged notebook, in order: its points (from the gradebook)
    and the judge's lines in its outputs."""
    nb = json.loads(judged.read_text()) if judged.is_file() else {"cells": []}
    found = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("grade") and meta.get("grade_id"):
            found[meta["grade_id"]] = CellResult(
                meta["grade_id"],
                float(points.get(meta["grade_id"], 0.0)),
                float(meta.get("points", 0)),
                verdict_lines(cell.get("outputs", [])),
            )
    for missing in sorted(set(points) - set(found)):  # no judged copy to read: points only
        found[missing] = CellResult(missing, float(points[missing]), 0.0)
    return list(found.values())


def verdict_lines(outputs: list[dict[str, Any]]) -> list[str]:
    """What a graded cell's outputs say about its score, each in one line: the judge's notes
    (unsandboxed, per-process accounting), the checks' lines (``[lab NN · …]``, with the target
    that applied) or else the cell's last printed line, and the error that zeroed it."""
    notes, verdicts, last, errors = [], [], [], []
    for output in outputs:
        if output.get("output_type") == "stream":
            text = _text(output.get("text", ""))
            lines = [line.strip() for line in text.splitlines() if line.strip()]
            notes += [line for line in lines if line.startswith(JUDGE_NOTES)]
            verdicts += [line for line in lines if line.startswith("[lab ")]
            last = [line for line in lines if not line.startswith(JUDGE_NOTES)][-1:] or last
        elif output.get("output_type") == "error":
            value = str(output.get("evalue", "")).strip().splitlines()
            said = f"{output.get('ename', 'Error')}: {value[0] if value else ''}"
            errors.append(said.rstrip(": ")[:300])
    return [*notes, *(verdicts or last), *errors]


def report(checked: Checked) -> str:
    """What ``ptcourse check`` prints for one check."""
    head = f"Lab {checked.lab.number} ({checked.lab.name})"
    if checked.status != "graded":
        why = checked.detail.strip().splitlines()
        return f"{head}: not graded ({checked.status}): {why[-1] if why else 'no reason given'}"
    width = max((len(c.cell) for c in checked.cells), default=0)
    lines = []
    for c in checked.cells:
        score = f"{c.points:g}/{c.max_points:g}"
        first, *more = c.lines or ["(no message)"]
        lines.append(f"  {c.cell:<{width}}  {score:>7}  {first}")
        lines += [f"  {'':<{width}}  {'':>7}  {line}" for line in more]
    total = f"{head}: {checked.points:g}/{checked.max_points:g} autograded points"
    if checked.written_max:
        total += (
            f"; {checked.written_max:g} more for written answers, graded by hand "
            f"(ptcourse answers {checked.lab.number}: the model answers and rubrics)"
        )
    lines.append(total)
    if checked.feedback is not None:
        lines.append(f"feedback: {checked.feedback}")
    else:
        lines.append(f"feedback: none ({checked.detail.strip() or 'nbgrader wrote no HTML'})")
    return "\n".join(lines)


# The learner's progress


def progress_file() -> Path:
    return paths.BUILD / "progress.jsonl"


def record(checked: Checked, when: datetime.datetime | None = None) -> int:
    """Append one line per graded cell of ``checked`` to ``progress.jsonl``; returns how many."""
    if checked.status != "graded":
        return 0
    stamp = (when or datetime.datetime.now(datetime.timezone.utc)).isoformat(
        timespec="milliseconds"
    )
    rows = [
        {
            "time": stamp,
            "lab": checked.lab.name,
            "cell": c.cell,
            "points": c.points,
            "max": c.max_points,
            "smoke": smoke.is_smoke(),
        }
        for c in checked.cells
    ]
    path = progress_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    return len(rows)


def checks() -> dict[str, list[float]]:
    """Each checked lab's total points per check, oldest first (the lines of one check share
    its time); lines that cannot be read are skipped."""
    path = progress_file()
    totals: dict[tuple[str, str], float] = {}
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            row = json.loads(line)
            key = (str(row["lab"]), str(row["time"]))
            totals[key] = totals.get(key, 0.0) + float(row["points"])
        except (ValueError, KeyError, TypeError):
            continue
    per_lab: dict[str, list[float]] = {}
    for (name, _), total in totals.items():  # in file order: a dict keeps insertion order
        per_lab.setdefault(name, []).append(total)
    return per_lab


def autograded_max(the_lab: Lab) -> float:
    """The lab's autograded points, from its solution notebook."""
    nb = json.loads(paths.notebook(the_lab).read_text())
    return sum(
        float(cell["metadata"]["nbgrader"].get("points", 0))
        for cell in nb["cells"]
        if cell.get("cell_type") == "code" and cell["metadata"].get("nbgrader", {}).get("grade")
    )


def progress_table() -> str:
    """Labs × points: the best and the last check's autograded points ("—" where a lab was
    never checked), the lab's maximum and how many checks."""
    done = checks()
    lines = [f"{'lab':<24}{'best':>7}{'last':>7}{'max':>7}{'checks':>8}"]
    best_sum = last_sum = max_sum = 0.0
    for each in paths.course_labs():
        totals = done.get(each.name, [])
        most = autograded_max(each)
        max_sum += most
        best = last = "—"
        if totals:
            best, last = f"{max(totals):g}", f"{totals[-1]:g}"
            best_sum, last_sum = best_sum + max(totals), last_sum + totals[-1]
        lines.append(f"{each.name:<24}{best:>7}{last:>7}{most:>7g}{len(totals):>8}")
    best_total, last_total = (f"{best_sum:g}", f"{last_sum:g}") if done else ("—", "—")
    lines.append(f"{'total':<24}{best_total:>7}{last_total:>7}{max_sum:>7g}")
    return "\n".join(lines)


# The model answers


def answers(key: str) -> str:
    """The instructors' model answers of lab ``key``: every written question with its model
    answer and rubric, and every exercise's solution code, once the lab has been checked."""
    the_lab = lab(key)  # or an UnknownLab
    paths.course_labs([the_lab.number])
    if the_lab.name not in checks():
        raise CourseInputError(
            f"Lab {the_lab.number}'s model answers open after you have checked it: run "
            f"`ptcourse check {the_lab.number}` first"
        )
    source = paths.notebook(the_lab)
    lines = [
        f"The instructors' model answers for Lab {the_lab.number} ({the_lab.name}): written "
        f"questions with their rubrics, and the exercises' solution code "
        f"(from {source.relative_to(paths.ROOT)})"
    ]
    cells = json.loads(source.read_text())["cells"]
    for index, cell in enumerate(cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not meta.get("solution"):
            continue
        text = _text(cell.get("source", ""))
        if cell.get("cell_type") == "markdown":
            points = meta.get("points", 0)
            lines.append(f"\n── {meta['grade_id']} · written question, {_points(points)} ──")
            question = cells[index - 1] if index else {}
            if question.get("cell_type") == "markdown":
                lines.append(_text(question.get("source", "")).strip() + "\n")
            lines.append(text.strip())
        else:
            lines.append(f"\n── {meta['grade_id']} · exercise, solution code ──")
            lines.append(solution_code(text))
    return "\n".join(lines)


def solution_code(source: str) -> str:
    """A solution cell's code without nbgrader's BEGIN/END SOLUTION marker lines."""
    kept = [line for line in source.splitlines() if line.strip() not in (BEGIN, END)]
    return "\n".join(kept).strip("\n")


def _text(value: str | list[str]) -> str:
    return value if isinstance(value, str) else "".join(value)


def _tail(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _points(points: float) -> str:
    return f"{points:g} point" + ("" if points == 1 else "s")
