"""Notebooks are committed clean and carry valid nbgrader metadata."""

import json
import re

import pytest
from labs_under_test import selected_labs

from ptcourse.course import paths

LABS = paths.course_labs(selected_labs())
FOLDERS = ("solutions", "labs")


def cells(path):
    return json.loads(path.read_text())["cells"]


@pytest.mark.parametrize("folder", FOLDERS)
@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_no_outputs_and_kernelspec(lab, folder):
    path = paths.notebook(lab, folder)
    nb = json.loads(path.read_text())
    assert nb["metadata"]["kernelspec"]["name"] == "python3"
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert not cell["outputs"] and cell["execution_count"] is None, path


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_nbgrader_metadata(lab):
    meta = [c["metadata"].get("nbgrader") for c in cells(paths.notebook(lab))]
    ids = [m["grade_id"] for m in meta if m]
    assert len(ids) == len(set(ids)), "grade_ids must be unique"
    graded = [m for m in meta if m and m["grade"]]
    assert graded and all(m["points"] > 0 for m in graded)
    assert any(m["solution"] for m in graded), "a manually graded written answer"
    assert any(m for m in meta if m and m["solution"] and not m["grade"]), "an exercise"


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_locked_parameters_and_setup_cells(lab):
    nb_cells = cells(paths.notebook(lab))
    params = [c for c in nb_cells if "parameters" in c["metadata"].get("tags", [])]
    assert len(params) == 1
    assert params[0]["metadata"]["nbgrader"]["locked"]
    assert "SMOKE = False" in "".join(params[0]["source"])
    assert any(c["metadata"].get("nbgrader", {}).get("grade_id") == "setup" for c in nb_cells)


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_hidden_tests_only_in_locked_test_cells_and_reload_graders(lab):
    for cell in cells(paths.notebook(lab)):
        source = "".join(cell["source"])
        if "### BEGIN HIDDEN TESTS" in source:
            meta = cell["metadata"]["nbgrader"]
            assert meta["grade"] and meta["locked"] and not meta["solution"]
            assert f'fresh("{lab.number}")' in source or "fresh()" in source, "reload the graders"


def written_questions(path):
    for cell in cells(path):
        meta = cell["metadata"].get("nbgrader", {})
        if meta.get("grade") and meta.get("solution") and cell["cell_type"] == "markdown":
            yield meta["grade_id"], "".join(cell["source"])


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_every_written_question_has_a_model_answer_and_a_rubric(lab):
    """Hand-grading needs both; the instructors' notebook holds them, the release does not."""
    for grade_id, source in written_questions(paths.notebook(lab)):
        assert "Model answer (instructors)" in source, f"{grade_id}: no model answer"
        assert "Rubric (" in source, f"{grade_id}: no rubric"
    for grade_id, source in written_questions(paths.notebook(lab, "labs")):
        assert "Model answer" not in source and "Rubric (" not in source, grade_id


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_the_top_cell_states_the_time_and_explains_smoke_mode(lab):
    top = "".join(cells(paths.notebook(lab))[0]["source"])
    assert top.count("**Smoke mode.**") == 1, "the smoke paragraph, once"
    assert "PTCOURSE_SMOKE=1" in top
    assert "minutes" in top, "an honest time to work through the lab"


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_the_stated_time_is_the_same_in_the_notebook_the_lineup_and_the_readme(lab):
    top = "".join(cells(paths.notebook(lab))[0]["source"])
    assert f"about {lab.minutes} minutes" in top, f"the lineup says {lab.minutes} minutes"
    row = next(line for line in (paths.ROOT / "README.md").read_text().splitlines()
               if line.startswith(f"| {lab.number} |"))  # fmt: skip
    assert row.endswith(f"| {lab.minutes} min |"), row


GRADED_LINE = re.compile(r"\*\*Graded:\*\*(.*?)(?:\n\n|$)", re.S)


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_the_graded_line_says_what_the_notebook_grades(lab):
    """The introduction's **Graded:** paragraph ends its list with "N points in all", N the sum
    of the notebook's graded cells: a learner reads the stakes before starting."""
    found = cells(paths.notebook(lab))
    line = GRADED_LINE.search("".join(found[0]["source"]))
    assert line, "the first cell has no **Graded:** paragraph"
    stated = re.search(r"(\d+) points in all", " ".join(line.group(1).split()))
    assert stated, "the **Graded:** paragraph does not say how many points in all"
    points = sum(
        cell["metadata"].get("nbgrader", {}).get("points", 0)
        for cell in found
        if cell["metadata"].get("nbgrader", {}).get("grade")
    )
    assert int(stated.group(1)) == points


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_each_written_answer_has_one_rubric(lab):
    """A model answer and one rubric (``ptcourse answers`` prints the cell as it is)."""
    for cell in cells(paths.notebook(lab)):
        meta = cell["metadata"].get("nbgrader", {})
        if cell["cell_type"] == "markdown" and meta.get("solution"):
            text = "".join(cell["source"])
            assert len(re.findall(r"^Rubric\b", text, re.M)) == 1, meta["grade_id"]
