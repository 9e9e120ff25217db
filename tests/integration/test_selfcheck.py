"""A learner's own check, for real (`ptcourse check`): a blank Lab 04 is judged in the sandbox
at smoke size with its own gradebook, scores 0 on every autograded cell, says per cell why,
writes its feedback HTML and one progress line per cell, and then opens the model answers."""

import json
import os
import subprocess
import sys

import pytest
from labs_under_test import selected_labs

from ptcourse.core.lineup import lab
from ptcourse.course import paths

pytestmark = [pytest.mark.grading, pytest.mark.whole_machine]
ACCUMULATION = lab("04")


def ptcourse(*args, build):
    env = {**os.environ, "PTCOURSE_SMOKE": "1", "PTCOURSE_BUILD": str(build)}
    return subprocess.run(
        [sys.executable, "-m", "ptcourse.course.cli", *args],
        cwd=paths.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.mark.skipif(
    bool(selected_labs()) and ACCUMULATION not in paths.course_labs(selected_labs()),
    reason="Lab 04 is not among PTCOURSE_TEST_LABS",
)
def test_checking_a_blank_lab_scores_zero_with_feedback_and_progress(tmp_path):
    build = tmp_path / "build"
    done = ptcourse("check", "04", build=build)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("checking Lab 04 ("), lines
    cells = [line.split() for line in lines[1:-2]]
    assert len(cells) == 5 and all(cell[1].startswith("0/") for cell in cells), lines
    assert all(len(cell) > 2 and cell[2] != "(no message)" for cell in cells), lines
    assert lines[-2].startswith("Lab 04 (04-grad-accumulation): 0/10 autograded points"), lines
    feedback = lines[-1].removeprefix("feedback: ")
    assert feedback.startswith(str(build / "check")) and os.path.isfile(feedback), lines
    rows = [json.loads(line) for line in (build / "progress.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and {r["lab"] for r in rows} == {ACCUMULATION.name}
    assert sum(r["points"] for r in rows) == 0 and sum(r["max"] for r in rows) == 10
    assert not (build / "nbgrader").exists()  # the check's gradebook is its own
    answers = ptcourse("answers", "04", build=build)
    assert answers.returncode == 0 and "instructors'" in answers.stdout.splitlines()[0]
