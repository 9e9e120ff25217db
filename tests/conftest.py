import time
from collections import defaultdict

import pytest

STARTED = time.time()
# The suite's tiers, by the file a test lives in (the first match names it).
TIERS = (
    ("tests/unit/", "unit"),
    ("tests/integration/test_notebooks.py", "notebooks (papermill, smoke)"),
    ("tests/integration/test_grading.py", "grading (judge, every lab)"),
    ("tests/integration/test_matrix.py", "matrix slice"),
    ("tests/integration/test_cluster.py", "cluster (Dask)"),
    ("tests/integration/test_binder.py", "binder"),
    ("tests/integration/", "sync, format, references"),
    ("tests/adversarial/", "adversarial slice"),
    ("tests/browser/", "browser"),
    ("tests/workshop/", "workshop (JupyterHub)"),
)
TIER_SECONDS: dict[str, float] = defaultdict(float)
TIER_TESTS: dict[str, int] = defaultdict(int)


def tier_of(nodeid: str) -> str:
    return next((name for prefix, name in TIERS if nodeid.startswith(prefix)), "other")


def pytest_runtest_logreport(report):
    tier = tier_of(report.nodeid)
    TIER_SECONDS[tier] += report.duration
    TIER_TESTS[tier] += report.when == "call"


@pytest.fixture
def busy_core():
    """Keep the other core busy, as a shared machine would."""
    from ptcourse.core import measure

    with measure.busy_cores(1, max_seconds=3600):
        yield


def pytest_terminal_summary(terminalreporter):
    """Print the time each tier took (setup, call and teardown of its tests), then per-lab run
    times of the notebook tier, from the report card it wrote."""
    import json

    from ptcourse.course import paths

    if TIER_SECONDS:
        terminalreporter.section("time per tier")
        total = sum(TIER_SECONDS.values())
        for tier, seconds in sorted(TIER_SECONDS.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(
                f"{tier:<30} {seconds:7.0f} s  {100 * seconds / total:5.1f}%  "
                f"{TIER_TESTS[tier]:4d} tests"
            )
        terminalreporter.write_line(f"{'all':<30} {total:7.0f} s")
    path = paths.BUILD / "report" / "report.json"
    if not path.exists() or path.stat().st_mtime < STARTED:
        return
    terminalreporter.section("per-lab smoke run times")
    for run in json.loads(path.read_text())["labs"]:
        met = sum(r["points"] >= r["max_points"] for r in run["results"])
        terminalreporter.write_line(
            f"{run['lab']:<24} {run['seconds']:6.1f} s  track {run['track']:<10} "
            f"{met}/{len(run['results'])} targets met"
        )


@pytest.fixture
def lab_worker(tmp_path):
    """``lab_worker(cell, env)``: a judge's worker (sandboxed where bubblewrap is) that has run
    ``cell`` without an error, killed after the test."""
    import sys
    from pathlib import Path

    from ptcourse.course.paths import BUILD, ROOT
    from ptcourse.judge import sandbox
    from ptcourse.judge.remote import WorkerProcess

    started = []

    def start(cell: str, env: dict[str, str]):
        (tmp_path / "submission").mkdir(exist_ok=True)
        readable = [ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]
        worker = WorkerProcess(
            tmp_path / "submission", tmp_path / "scratch", env, readable, [BUILD],
            sandboxed=sandbox.unavailable() is None,
        ).start()  # fmt: skip
        started.append(worker)
        outputs = worker.request("cell", cell, 0)["outputs"]
        assert not [o for o in outputs if o["output_type"] == "error"], outputs
        return worker

    yield start
    for worker in started:
        worker.kill()
