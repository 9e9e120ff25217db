"""What ``ptcourse grade`` takes in: the submissions folder, and each lab's notebook in it.

Before nbgrader or the judge touches a submission, its notebook is read here. A file that is
not a notebook (not UTF-8, not JSON, JSON of another shape), a notebook without nbgrader's cell
ids (made outside the lab's copy, or its cell metadata cleared) and another lab's notebook
handed in under this lab's name are graded "failed" with one line that says what is wrong and
what to do; nothing in them runs. Where the notebook is missing, one line says where it seems
to be instead (a folder or file under another name; the lab's notebook, known by its cells, in
another folder), so that the learner can hand it in again.

Which lab a notebook is comes from its nbgrader cell ids (``grade_id``): a lab's are those of
its solution notebook, and the ids that only one lab has (not ``setup``, ``parameters``,
``sizes``) name it. They survive the learner's editing (JupyterLab keeps a cell's metadata
when it is copied, moved or edited) and nbgrader grades by them.
"""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import nbformat
from nbformat.reader import NotJSONError

from ptcourse.core.errors import CourseInputError
from ptcourse.core.lineup import LABS, Lab, UnknownLab, lab
from ptcourse.course import paths

LAYOUT = "SUBMISSIONS/<student>/<lab>/<lab>.ipynb, e.g. alice/06-attention/06-attention.ipynb"
LOOKED_AT = 20  # notebooks of one student read to find a missing one


def fresh(the_lab: Lab) -> str:
    """What a learner whose notebook cannot be graded does next."""
    name = the_lab.name
    return (
        f"start from a fresh copy of labs/{name}/{name}.ipynb, paste your code into its cells "
        "and hand that in"
    )


def students(submissions: Path) -> list[str]:
    """The student folders of ``submissions``, or a CourseInputError that says what is wrong."""
    if not submissions.exists():
        raise CourseInputError(
            f"no such folder: {submissions} (grade a folder laid out as {LAYOUT})"
        )
    if not submissions.is_dir():
        raise CourseInputError(f"not a folder: {submissions} (grade a folder laid out as {LAYOUT})")
    names = sorted(
        p.name for p in submissions.iterdir() if p.is_dir() and not p.name.startswith(".")
    )
    if not names:
        raise CourseInputError(f"no student folders in {submissions} (it should hold {LAYOUT})")
    if all(name in {each.name for each in LABS} for name in names):
        raise CourseInputError(
            f"{submissions} holds lab folders ({', '.join(names)}), not student folders: "
            f"grade the folder above it, laid out as {LAYOUT}"
        )
    return names


def strays(submissions: Path, names: Iterable[str]) -> list[str]:
    """One line for each folder in a student's folder that is not named as a lab's folder is
    (06-attention): it is not graded (:func:`whereabouts` says so where it holds a lab's
    notebook)."""
    lines = []
    for student in names:
        for folder in sorted((submissions / student).iterdir()):
            if (
                folder.is_dir()
                and not folder.name.startswith(".")
                and not _is_lab_name(folder.name)
            ):
                lines.append(
                    f"{student}/{folder.name}/ is not a lab folder and is not graded "
                    f"(lab folders are named like 06-attention)"
                )
    return lines


def refusal(the_lab: Lab, notebook: Path) -> str | None:
    """Why the notebook handed in as ``the_lab`` cannot be graded as it, in one line that says
    what to do; None when it can (or is not there: a missing notebook is not refused)."""
    if not notebook.is_file():
        return None
    try:
        nb = read(notebook)
    except NotANotebook as error:
        return f"not a notebook: {error} — {fresh(the_lab)}"
    ids = set(grade_ids(nb))
    mine = own_cells().get(the_lab.name, frozenset())
    if not mine or mine & ids:
        return None
    number = the_lab.number
    if not ids:
        return (
            "the notebook has no nbgrader cell ids (made outside the lab's copy, or its cell "
            f"metadata cleared?) — {fresh(the_lab)}"
        )
    other = lab_of(ids)
    if other is None:
        return (
            f"the notebook has none of Lab {number}'s cells (a notebook from elsewhere?) — "
            f"{fresh(the_lab)}"
        )
    return (
        f"this is Lab {other.number}'s notebook ({other.name}), handed in as Lab {number} "
        f"({the_lab.name}) — hand in Lab {number}'s notebook as {_wanted(the_lab)} and this one "
        f"as {_wanted(other)}"
    )


def whereabouts(the_lab: Lab, student: Path) -> str:
    """Where ``the_lab``'s notebook seems to be when ``student/<lab>/<lab>.ipynb`` is missing,
    in one line that says how to hand it in; "" where nothing under ``student`` looks like it."""
    wanted = _wanted(the_lab)
    for path in _notebooks(student):
        folder = path.parent.name if path.parent != student else ""
        named = (_names(folder) if folder else None) or _names(path.stem)
        if named == the_lab or (named is None and _is_of(path, the_lab)):
            where = path.relative_to(student)
            return f"Lab {the_lab.number}'s notebook is at {where} — hand it in as {wanted}"
    if (student / the_lab.name).is_dir():
        return f"{the_lab.name}/ holds no notebook — hand in {wanted}"
    return ""


class NotANotebook(ValueError):
    """A file that nbformat cannot read as a notebook; the message says why, in one line."""


def read(path: Path) -> dict[str, Any]:
    """The notebook at ``path``, as JSON, once nbformat has shown it can read it."""
    data = path.read_bytes()
    if not data.strip():
        raise NotANotebook("the file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise NotANotebook(
            f"not UTF-8 text (byte {data[error.start]:#04x} at offset {error.start}: "
            "a file of another kind, renamed?)"
        ) from None
    try:
        nb = nbformat.reader.parse_json(text)
    except NotJSONError as error:
        cause = error.__cause__
        if isinstance(cause, json.JSONDecodeError):
            where = f"line {cause.lineno} column {cause.colno}"  # json's own words, less the char
            raise NotANotebook(f"invalid JSON: {cause.msg}: {where}") from None
        raise NotANotebook(str(error)) from None
    if not isinstance(nb, dict):
        raise NotANotebook(f"a JSON {_kind(nb)}, where a notebook is an object with cells")
    if "cells" not in nb and "worksheets" not in nb:  # worksheets: nbformat 3 and older
        raise NotANotebook("JSON without a notebook's cells")
    cells = nb.get("cells", [])
    if not isinstance(cells, list):
        raise NotANotebook(f"its cells are a JSON {_kind(cells)}, not a list")
    for number, cell in enumerate(cells, 1):
        if not isinstance(cell, dict):
            raise NotANotebook(f"cell {number} is a JSON {_kind(cell)}, not a cell")
    try:  # nbformat's own reading, as nbgrader's: a version it cannot read or convert
        nbformat.convert(nbformat.reader.reads(text), 4)
    except Exception as error:
        reason = getattr(error, "message", None) or str(error) or type(error).__name__
        raise NotANotebook(f"nbformat cannot read it: {reason.splitlines()[0][:160]}") from None
    return nb


def grade_ids(nb: dict[str, Any]) -> list[str]:
    """The nbgrader cell ids of notebook ``nb`` (JSON), in order."""
    ids = []
    for cell in nb.get("cells", []):
        meta = cell.get("metadata") if isinstance(cell, dict) else None
        nbgrader = meta.get("nbgrader") if isinstance(meta, dict) else None
        grade_id = nbgrader.get("grade_id") if isinstance(nbgrader, dict) else None
        if isinstance(grade_id, str):
            ids.append(grade_id)
    return ids


@functools.cache
def lab_cells() -> dict[str, tuple[str, ...]]:
    """Each written lab's nbgrader cell ids, from its solution notebook."""
    return {
        each.name: tuple(grade_ids(json.loads(paths.notebook(each).read_text())))
        for each in LABS
        if paths.notebook(each).exists()
    }


@functools.cache
def own_cells() -> dict[str, frozenset[str]]:
    """Each lab's cell ids that no other lab has: they name the lab."""
    counts = Counter(i for ids in lab_cells().values() for i in set(ids))
    return {name: frozenset(i for i in ids if counts[i] == 1) for name, ids in lab_cells().items()}


def lab_of(ids: Iterable[str]) -> Lab | None:
    """The lab that the most of ``ids`` name (None where they name none)."""
    ids = set(ids)
    hits = {name: len(own & ids) for name, own in own_cells().items()}
    best = max(hits, key=hits.__getitem__, default=None)
    return lab(best) if best is not None and hits[best] else None


def lacking(the_lab: Lab, notebook: Path) -> list[str]:
    """The cell ids of ``the_lab`` that the notebook lacks ([] where it cannot be read)."""
    try:
        present = set(grade_ids(json.loads(notebook.read_text())))
    except (OSError, ValueError):
        return []
    return [i for i in lab_cells().get(the_lab.name, ()) if i not in present]


_EXCEPTION_LINE = re.compile(r"^\s*([A-Za-z_][\w.]*(?:Error|Exception|Exit)): (.*)$")


def nbgrader_failure(the_lab: Lab, log: str, notebook: Path) -> str:
    """One line for a submission nbgrader could not take, never its traceback: the exception its
    log shows and, where the notebook lacks some of the lab's cells (nbgrader fails to put back
    a deleted test cell after a deleted exercise), which, and what to do."""
    raised = [
        f"{m[1].rsplit('.', 1)[-1]}: {m[2]}"
        for m in map(_EXCEPTION_LINE.match, log.splitlines())
        if m and not m[1].endswith("NbGraderException")
    ]
    why = f" ({raised[-1][:160]})" if raised else ""
    missing = lacking(the_lab, notebook)
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    if not missing:  # not the notebook's fault, as far as can be seen: no advice to the learner
        return f"nbgrader could not take the notebook{why}"
    lacks = f"it lacks Lab {the_lab.number}'s cells {shown} (deleted?)"
    return f"nbgrader could not take the notebook{why}: {lacks} — {fresh(the_lab)}"


def _wanted(the_lab: Lab) -> str:
    return f"{the_lab.name}/{the_lab.name}.ipynb"


def _kind(value: object) -> str:
    kinds = {list: "list", str: "string", bool: "true/false", type(None): "null", dict: "object"}
    return kinds.get(type(value), "number")


def _names(text: str) -> Lab | None:
    """The lab that ``text`` (a folder's or a notebook's name) names, if any."""
    try:
        return lab(text)
    except UnknownLab:
        return None


def _is_lab_name(text: str) -> bool:
    return any(text == each.name for each in LABS)


def _notebooks(student: Path) -> list[Path]:
    """The notebooks under a student's folder (not in hidden folders: checkpoints), a few."""
    if not student.is_dir():
        return []
    found = (p for p in sorted(student.rglob("*.ipynb")) if p.is_file())
    visible = (
        p for p in found if not any(part.startswith(".") for part in p.relative_to(student).parts)
    )
    return [p for _, p in zip(range(LOOKED_AT), visible, strict=False)]


def _is_of(path: Path, the_lab: Lab) -> bool:
    try:
        return lab_of(grade_ids(json.loads(path.read_text()))) == the_lab
    except (OSError, ValueError, AttributeError):
        return False
