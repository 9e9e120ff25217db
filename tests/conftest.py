import time

import pytest

STARTED = time.time()


@pytest.fixture
def busy_core():
    """Keep the other core busy, as a shared machine would."""
    from ptcourse.core import measure

    with measure.busy_cores(1, max_seconds=3600):
        yield


def pytest_terminal_summary(terminalreporter):
    """Print per-lab run times of the notebook tier, from the report card it wrote."""
    import json

    from ptcourse.course import paths

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
