"""Every solution notebook runs end to end under papermill in smoke mode, through the CLI."""

import json
import subprocess
import sys

import nbformat
import pytest
from labs_under_test import selected_labs

from ptcourse.course import paths

LABS = paths.course_labs(selected_labs())
pytestmark = [pytest.mark.notebooks, pytest.mark.whole_machine]  # two lanes


@pytest.fixture(scope="module")
def report():
    done = subprocess.run(
        # two lanes, one notebook per core beside a busy neighbour, as the grading tier grades
        [sys.executable, "-m", "ptcourse.course.cli", "run", "--smoke", "--solutions", "--lanes=2"]
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


SMOKE_LIMIT_S = 60


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_solution_runs_in_smoke_mode(lab, report):
    run = report[lab.name]
    assert run["ok"], run["error"]
    # A learner's smoke run takes at most a minute on every CPU class (here each lab runs in a
    # lane beside another lab, which costs more than a run alone).
    assert run["seconds"] < SMOKE_LIMIT_S, f"smoke run took {run['seconds']} s"


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_solution_meets_every_target(lab, report):
    results = report[lab.name]["results"]
    assert results, "the lab recorded no graded measurement"
    missed = [r["message"] for r in results if r["points"] < r["max_points"]]
    assert not missed, "\n".join(missed)


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_every_measured_target_is_shown_before_its_hidden_check(lab, report):
    """Each measured check the hidden tests graded (not the pass/fail ``score`` rows) had its
    target printed first by a visible cell or the visible part of its test cell
    (``checks.target_here``), with the value that applies on this machine: a student never
    meets a graded number only in the grade."""
    run = report[lab.name]
    printed = "".join(
        output.text
        for cell in nbformat.read(run["output"], as_version=4).cells
        for output in cell.get("outputs", [])
        if output.output_type == "stream"
    )
    for result in run["results"]:
        if result["kind"] == "score":
            continue
        where = f"[lab {result['lab']} · {result['check']}]"
        shown = printed.find(f"{where} the hidden check asks")
        assert shown >= 0, f"{result['check']}: no visible cell printed its target"
        assert shown < printed.find(f"{where} {result['kind']}"), f"{result['check']}: shown late"
