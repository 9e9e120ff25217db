"""nbgrader configuration: solutions/ is the source, labs/ the release, the rest in build/."""

import os
import sys

c = get_config()  # noqa: F821 — provided by nbgrader's config loader

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "labs"
# PTCOURSE_BUILD moves every generated file elsewhere (separate grading runs never share a
# gradebook).
build = os.path.join(c.CourseDirectory.root, os.environ.get("PTCOURSE_BUILD", "build"), "nbgrader")
c.CourseDirectory.submitted_directory = os.path.join(build, "submitted")
c.CourseDirectory.autograded_directory = os.path.join(build, "autograded")
c.CourseDirectory.feedback_directory = os.path.join(build, "feedback")
c.CourseDirectory.db_url = "sqlite:///" + os.path.join(build, "gradebook.db")
os.makedirs(build, exist_ok=True)

# Benchmarks run inside test cells: allow each cell several minutes (a looping cell is cut here).
c.Execute.timeout = int(os.environ.get("PTCOURSE_CELL_TIMEOUT", "300"))
c.Execute.kernel_name = "python3"
# A student who deletes a test cell does not escape it.
c.OverwriteCells.add_missing_cells = True
# Hidden tests stay hidden in the feedback students get back.
c.GenerateFeedback.preprocessors = [
    "nbgrader.preprocessors.GetGrades",
    "nbgrader.preprocessors.ClearHiddenTests",
    "nbconvert.preprocessors.CSSHTMLHeaderPreprocessor",
]
# nbgrader runs alembic as a subprocess when it creates a gradebook: it must be on PATH.
os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
