"""Release: regenerate the student version of each lab from solutions/ with nbgrader."""

from __future__ import annotations

from pathlib import Path

from ptcourse.course.paths import ROOT, course_labs


def nbgrader_api(release_dir: Path | None = None):  # -> nbgrader.apps.NbGraderAPI
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
    api, written = nbgrader_api(release_dir), []
    for each in course_labs(keys):
        done = api.generate_assignment(each.name, force=True)
        if not done["success"]:
            raise RuntimeError(f"nbgrader could not release {each.name}:\n{done['error'][-2000:]}")
        written.append((release_dir or ROOT / "labs") / each.name / f"{each.name}.ipynb")
    return written
