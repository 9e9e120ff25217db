"""What the kernel counts for a sandbox: a control group's CPU time, memory peak and freezer
cover every process in it, those forked during a call and those gone before a reading."""

import subprocess
import sys
import time

import pytest

from ptcourse.judge import accounting

FORKS_AND_EXITS = """
import os, time
for _ in range(4):  # four children that work 0.2 s of CPU each and are gone before we look
    if os.fork() == 0:
        end = time.process_time() + 0.2
        while time.process_time() < end:
            pass
        os._exit(0)
    os.wait()
x = bytearray(200 * 2**20)  # 200 MB touched, then freed
for i in range(0, len(x), 4096):
    x[i] = 1
del x
print("done", flush=True)
time.sleep(30)
"""


@pytest.fixture
def group():
    made = accounting.for_sandbox(64)
    if not made.exact:
        pytest.skip(f"no control group can be made here ({made.kind})")
    yield made
    made.release()


def test_cpu_and_peak_memory_of_processes_that_already_exited_are_counted(group):
    child = subprocess.Popen(
        [sys.executable, "-c", FORKS_AND_EXITS], preexec_fn=group.join, stdout=subprocess.PIPE
    )
    group.started(child.pid)
    assert child.stdout.readline() == b"done\n"
    assert group.cpu_seconds() >= 0.75  # the four exited children's 0.8 s, and more
    assert group.peak_bytes() >= 200 * 2**20 > group.memory_bytes()
    group.reset_peak()
    assert group.peak_bytes() < 200 * 2**20
    assert group.pids() == [child.pid]
    group.release()
    assert child.wait(timeout=10) != 0 and group.pids() == []


def test_a_frozen_group_stops_a_process_that_keeps_forking(group):
    spawner = (
        "import os, time\n"
        "while True:\n"
        "    if os.fork() == 0:\n"
        "        end = time.time() + 0.01\n"
        "        while time.time() < end:\n"
        "            pass\n"
        "        os._exit(0)\n"
        "    os.wait()\n"
    )
    child = subprocess.Popen([sys.executable, "-c", spawner], preexec_fn=group.join)
    time.sleep(0.3)
    group.freeze()
    before = group.cpu_seconds()
    time.sleep(0.3)
    assert group.cpu_seconds() - before < 0.005
    group.thaw()
    time.sleep(0.3)
    assert group.cpu_seconds() - before > 0.1
    group.release()
    child.wait(timeout=10)


def test_per_process_accounting_is_the_fallback_and_says_so(monkeypatch):
    monkeypatch.setenv("PTCOURSE_ACCOUNTING", "proc")
    fallback = accounting.for_sandbox(64)
    assert isinstance(fallback, accounting.PerProcess) and not fallback.exact
    assert "no control group" in fallback.kind
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    fallback.started(child.pid)
    assert fallback.pids() == [child.pid] and fallback.memory_bytes() > 0
    assert fallback.peak_bytes() is None  # the judge samples instead
    fallback.release()
    child.wait(timeout=10)


def test_cgroup_v2_reads_its_own_files(tmp_path):
    """The v2 backend on a group folder made up here (the course's machines mount v1)."""
    for name, text in {
        "memory.current": "1000\n", "memory.peak": "5000\n", "cpu.stat": "usage_usec 2500000\n",
        "cgroup.procs": "12\n34\n", "cgroup.events": "populated 1\nfrozen 1\n",
    }.items():  # fmt: skip
        (tmp_path / name).write_text(text)
    group = accounting.CgroupV2(tmp_path, 16)
    assert (tmp_path / "pids.max").read_text() == "16"
    assert (tmp_path / "memory.peak").read_text() == "0"  # reset when made
    assert group.cpu_seconds() == 2.5 and group.memory_bytes() == 1000
    assert group.pids() == [12, 34]
    group.freeze()
    assert (tmp_path / "cgroup.freeze").read_text() == "1"
    group.thaw()
    assert (tmp_path / "cgroup.freeze").read_text() == "0"
    (tmp_path / "cpu.stat").unlink()
    with pytest.raises(OSError):
        accounting.CgroupV2(tmp_path, 16)  # no cpu controller delegated
