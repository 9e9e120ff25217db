"""Autograding through `ptcourse grade`: the solution scores full marks, an untouched lab 0,
a baseline-equivalent submission 0 on every speed check, and a looping exercise costs only its
own points — without stopping the grading of anyone else."""

import json
import os
import subprocess
import sys

import pytest
from labs_under_test import selected_labs
from submissions import VARIANTS

from ptcourse.course import autograde, paths

LABS = paths.course_labs(selected_labs())
pytestmark = [pytest.mark.grading, pytest.mark.whole_machine]  # two lanes


def variant(lab, replacements):
    nb = json.loads(paths.notebook(lab).read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in replacements:
            cell["source"] = replacements[grade_id]
    return nb


def _write_submissions(folder, loopers):
    """Every lab's reference, blank and variants into ``folder``; the loopers into ``loopers``."""
    for lab in LABS:
        autograde.copy_submission(paths.notebook(lab), folder, "reference", lab)
        autograde.copy_submission(paths.notebook(lab, "labs"), folder, "blank", lab)
        for student, replacements in VARIANTS.get(lab.name, {}).get("students", {}).items():
            where = loopers if student == "looper" else folder
            path = where / student / lab.name / f"{lab.name}.ipynb"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(variant(lab, replacements)))


# Two lanes, each judge and its workers pinned to one core (`ptcourse grade --lanes 2`): every
# submission is graded on one core beside a busy neighbour, as on a 2-core student machine
# running something else; the 2-core, one-lane configuration is tests/integration/test_matrix.py's.
LANES = "2"
# A cell's time limit: above the slowest cell of a reference, baseline copy or blank on the
# slowest machine class (Lab 12's compiled quick test, 19 s on the Sapphire Rapids VM and about
# twice that on the Zen 3 one). A looper hangs in three cells and its check: it is graded in a
# run of its own with a shorter limit (its lab's other cells take at most 11 s on the Sapphire
# Rapids VM), where it costs about a minute instead of four.
CELL_TIMEOUT_S, LOOPER_CELL_TIMEOUT_S = "60", "25"


def _grade(root, submissions, build, timeout, lanes):
    env = {
        **os.environ,
        "PTCOURSE_SMOKE": "1",
        "PTCOURSE_CELL_TIMEOUT": timeout,
        "PTCOURSE_BUILD": str(root / build),
    }
    command = [sys.executable, "-m", "ptcourse.course.cli", "grade", str(root / submissions)]
    command += ["--timeout", "900", "--lanes", lanes]
    done = subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=3000
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert (root / build / "grades" / "grades.csv").exists()
    return json.loads((root / build / "grades" / "grades.json").read_text())


@pytest.fixture(scope="module")
def grades(tmp_path_factory):
    root = tmp_path_factory.mktemp("grading")
    _write_submissions(root / "submissions", root / "loopers")
    scores = _grade(root, "submissions", "build", CELL_TIMEOUT_S, LANES)
    if (root / "loopers").exists():
        scores += _grade(root, "loopers", "build-loopers", LOOPER_CELL_TIMEOUT_S, "1")
    return {(s["student"], s["lab"]): s for s in scores}


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_solution_scores_full_autograded_marks(lab, grades):
    score = grades[("reference", lab.name)]
    assert score["status"] == "graded", score["detail"]
    assert score["auto_score"] == score["auto_max"] > 0, score["cells"]


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_untouched_lab_scores_zero_without_crashing(lab, grades):
    score = grades[("blank", lab.name)]
    assert score["status"] == "graded", score["detail"]
    assert score["auto_score"] == 0, score["cells"]


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_baseline_copy_scores_zero_on_every_speed_check(lab, grades):
    assert lab.name in VARIANTS, f"add tests/submissions/lab{lab.number}.py"
    spec = VARIANTS[lab.name]
    score = grades[("baseline", lab.name)]
    assert score["status"] == "graded", score["detail"]
    for cell in spec["speed_checks"]:
        assert score["cells"][cell] == 0, (cell, score["cells"])


@pytest.mark.parametrize(
    "lab",
    [x for x in LABS if "looper" in VARIANTS.get(x.name, {}).get("students", {})],
    ids=lambda x: x.name,
)
def test_looping_exercise_loses_only_its_own_points(lab, grades):
    spec = VARIANTS[lab.name]
    looper, reference = grades[("looper", lab.name)], grades[("reference", lab.name)]
    assert looper["status"] == "graded", looper["detail"]
    for cell, points in reference["cells"].items():
        expected = 0 if cell in spec["loop_checks"] else points
        assert looper["cells"][cell] == expected, (cell, looper["cells"])
