"""Where the course lives: the repository, the build folder, each lab's notebook."""

from __future__ import annotations

import os
from pathlib import Path

from ptcourse.core.errors import CourseInputError
from ptcourse.core.lineup import LABS, Lab, lab

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("PTCOURSE_BUILD", "build")  # relative to ROOT, or absolute
NBGRADER_DB = BUILD / "nbgrader" / "gradebook.db"


def notebook(the_lab: Lab, folder: str = "solutions") -> Path:
    return ROOT / folder / the_lab.name / f"{the_lab.name}.ipynb"


def course_labs(keys: list[str] | tuple[str, ...] = ()) -> list[Lab]:
    """The labs named by ``keys`` (all written labs when empty)."""
    chosen = [lab(key) for key in keys] if keys else list(LABS)
    missing = [each.name for each in chosen if keys and not notebook(each).exists()]
    if missing:
        raise CourseInputError(f"not written yet: {', '.join(missing)} (no notebook in solutions/)")
    return [each for each in chosen if notebook(each).exists()]
