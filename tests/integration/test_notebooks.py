"""Every solution notebook runs end to end under papermill in smoke mode, through the CLI."""

import json
import subprocess
import sys

import pytest
from labs_under_test import selected_labs

from ptcourse.course import paths

LABS = paths.course_labs(selected_labs())
pytestmark = pytest.mark.notebooks


@pytest.fixture(scope="module")
def report():
    done = subprocess.run(
        [sys.executable, "-m", "ptcourse.course.cli", "run", "--smoke", "--solutions"]
        + [lab.number for lab in LABS],
        cwd=paths.ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    print(done.stdout)  # per-lab times, shown with pytest -s and in failures
    path = paths.BUILD / "report" / "report.json"
    assert path.exists(), done.stdout + done.stderr[-3000:]
    assert (paths.BUILD / "report" / "report.html").exists()
    return {run["lab"]: run for run in json.loads(path.read_text())["labs"]}


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_solution_runs_in_smoke_mode(lab, report):
    run = report[lab.name]
    assert run["ok"], run["error"]
    assert run["seconds"] < 90, f"smoke run took {run['seconds']} s"


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_solution_meets_every_target(lab, report):
    results = report[lab.name]["results"]
    assert results, "the lab recorded no graded measurement"
    missed = [r["message"] for r in results if r["points"] < r["max_points"]]
    assert not missed, "\n".join(missed)
