"""Autograding through `ptcourse grade`: the solution scores full marks, an untouched lab 0,
a baseline-equivalent submission 0 on every speed check, and a looping exercise costs only its
own points — without stopping the grading of anyone else."""

import pytest
from labs_under_test import selected_labs
from submissions import VARIANTS

from ptcourse.course import paths

LABS = paths.course_labs(selected_labs())
# The session's shared grading run (tests/grading_run.py: two lanes, every lab's reference,
# blank and variants beside the adversarial slice) holds the whole machine while it grades.
pytestmark = [pytest.mark.grading, pytest.mark.whole_machine]


@pytest.fixture(scope="module")
def grades(course_grades):
    return {tuple(key.split("/")): score for key, score in course_grades["scores"].items()}


# A known wrong grade, not yet explained (2026-12-08, three clean-clone suites on the Intel AMX
# VM): in this shared two-lane run Lab 01's solution measured 0.95-1.59x on the speed check
# beside the reference's 3.7-3.8x, while the other lane graded Lab 00's looper; alone or beside
# another Lab 01 it measures 2.8-3.1x (full credit). Kept visible as XFAIL/XPASS until fixed.
KNOWN_WRONG = {
    "01": "Lab 01's speed check under the looper's lane: a known wrong grade (docs/grading.md)"
}


def _marked(labs):
    return [
        pytest.param(x, marks=pytest.mark.xfail(reason=KNOWN_WRONG[x.number], strict=False))
        if x.number in KNOWN_WRONG
        else x
        for x in labs
    ]


@pytest.mark.parametrize("lab", _marked(LABS), ids=lambda x: x.name)
def test_solution_scores_full_autograded_marks(lab, grades):
    score = grades[("reference", lab.name)]
    assert score["status"] == "graded", score["detail"]
    assert score["auto_score"] == score["auto_max"] > 0, (score["cells"], score["verdicts"])


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
        assert score["cells"][cell] == 0, (cell, score["cells"], score["verdicts"])


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
