import contextlib
import fcntl
import os
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import pytest

STARTED = time.time()
# The suite's tiers, by the file a test lives in (the first match names it).
TIERS = (
    ("tests/unit/", "unit"),
    ("tests/integration/test_notebooks.py", "notebooks (papermill, smoke)"),
    ("tests/integration/test_grading.py", "grading (judge, every lab)"),
    ("tests/integration/test_selfcheck.py", "grading (judge, every lab)"),
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
    """Each tier's time: its tests' setup, call and teardown, less the time a test waited for
    the machine while the other worker held it alone (tests/conftest.py's MachineLock)."""
    tier = tier_of(report.nodeid)
    waited = sum(v for k, v in report.user_properties if k == WAITED and report.when == "setup")
    TIER_SECONDS[tier] += report.duration - waited
    TIER_TESTS[tier] += report.when == "call"


# Two tests at a time (pytest-xdist, one per core), except where a test needs the whole machine:
# a tier that grades or runs notebooks in two lanes, or a test that loads the other core itself.
# Those hold the machine alone: every other test shares it with one neighbour, the condition the
# targets were measured in (one thread, the other core loaded).
WHOLE_MACHINE = "whole_machine"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    return max(1, min(2, len(os.sched_getaffinity(0))))


class MachineLock:
    """Shared (a test beside one other) or whole (alone) use of the machine, across the
    suite's worker processes: a writer-preferring reader-writer lock on two files, so a tier
    waiting for the whole machine is not starved by the stream of short tests beside it."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.gate, self.machine = folder / "gate.lock", folder / "machine.lock"

    @contextlib.contextmanager
    def hold(self, whole: bool):
        """Hold the machine; yields the seconds spent waiting for it."""
        start = time.monotonic()
        with open(self.gate, "a") as gate, open(self.machine, "a") as machine:
            fcntl.flock(gate, fcntl.LOCK_EX)  # a waiting "whole" keeps new "shared" out
            try:
                fcntl.flock(machine, fcntl.LOCK_EX if whole else fcntl.LOCK_SH)
            finally:
                if not whole:
                    fcntl.flock(gate, fcntl.LOCK_UN)
            try:
                yield time.monotonic() - start
            finally:
                fcntl.flock(machine, fcntl.LOCK_UN)
                if whole:
                    fcntl.flock(gate, fcntl.LOCK_UN)


RUN = os.environ.get("PYTEST_XDIST_TESTRUNUID", str(os.getpid()))
MACHINE = MachineLock(Path(tempfile.gettempdir()) / f"ptcourse-tests-{RUN}")


def _wants_whole(node) -> bool:
    return node.get_closest_marker(WHOLE_MACHINE) is not None


WAITED = "waited for the machine (s)"
_waited_by_module = [0.0]  # the module lock's wait, reported with the module's first test


@pytest.fixture(scope="module", autouse=True)
def _machine_for_the_module(request):
    """A module marked ``whole_machine`` holds the machine alone from its first fixture on."""
    if _wants_whole(request.node):
        with MACHINE.hold(whole=True) as waited:
            _waited_by_module[0] = waited
            yield
    else:
        yield


@pytest.fixture(autouse=True)
def _machine_for_the_test(request):
    """A test shares the machine with one other, or holds it alone where it is marked
    ``whole_machine`` or keeps the other core busy (``busy_core``)."""
    if _wants_whole(request.node.getparent(pytest.Module)):  # its module holds the machine
        request.node.user_properties.append((WAITED, _waited_by_module[0]))
        _waited_by_module[0] = 0.0
        yield
    else:
        whole = _wants_whole(request.node) or "busy_core" in request.fixturenames
        with MACHINE.hold(whole) as waited:
            request.node.user_properties.append((WAITED, waited))
            yield


@pytest.fixture(scope="module")
def course_grades(tmp_path_factory):
    """The session's one grading run of every selected lab with its variants and the
    adversarial slice (``tests/grading_run.py``), made by the first module that asks (which
    holds the whole machine), read by the others: {"scores": {"student/lab": score}, …}."""
    import grading_run
    from labs_under_test import selected_labs

    from ptcourse.course import paths

    keys = [the_lab.number for the_lab in paths.course_labs(selected_labs())]
    attacks = grading_run.slice_attacks()

    def compute(shared_folder):
        root = tmp_path_factory.mktemp("course-grades")
        return grading_run.course_grades(root, keys, attacks)

    return grading_run.shared(MACHINE.folder / "course-grades", compute)


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
        terminalreporter.write_line(
            f"{'all':<30} {total:7.0f} s  (wall {time.time() - STARTED:.0f} s: the tiers that "
            "need the whole machine run alone, the others two at a time)"
        )
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
