"""The sandbox keeps a submission's code away from the course, the other submissions, the
network and the machine's resources (bubblewrap; skipped where it cannot run)."""

import os
import time
from pathlib import Path

import pytest
from judged import error, printed, readable, run

from ptcourse.course.paths import BUILD, ROOT
from ptcourse.judge.accounting import process_tree


def test_the_course_the_venv_and_the_package_are_read_only(make_worker):
    worker = make_worker()
    for path in (ROOT / "ptcourse" / "labs" / "lab06_attention.py", ROOT / "solutions" / "x"):
        outputs = run(worker, f"open({str(path)!r}, 'a').write('# pwned')")
        assert "Read-only file system" in error(outputs), outputs


def test_the_build_folder_and_other_submissions_are_invisible(make_worker, tmp_path):
    (tmp_path / "submissions" / "other" / "lab").mkdir(parents=True)
    (tmp_path / "submissions" / "other" / "lab" / "secret.ipynb").write_text("{}")
    worker = make_worker()
    outputs = run(
        worker,
        "import os\n"
        f"print(os.path.exists({str(tmp_path / 'submissions' / 'other')!r}))\n"
        f"print(os.listdir({str(BUILD)!r}) if os.path.exists({str(BUILD)!r}) else [])\n"
        "print(os.environ['HOME'])\n"
        "print(*sorted(os.listdir('/root')))",
    )
    other, build, home, in_root = printed(outputs).split("\n")[:4]
    assert (other, build, home) == ("False", "[]", "/tmp/work/home"), outputs
    # /root shows only what the worker must read (a Python installed there), nothing else
    needed = {p.relative_to("/root").parts[0] for p in readable() if p.is_relative_to("/root")}
    assert set(in_root.split()) <= needed, in_root


def test_private_scratch_holds_the_submission_and_is_capped(make_worker):
    worker = make_worker({"data.txt": "hello"}, scratch_bytes=64 * 2**20, file_bytes=2**30)
    assert printed(run(worker, "print(open('data.txt').read())")) == "hello\n"
    outputs = run(worker, "open('big', 'wb').write(b'0' * (100 * 2**20))")
    assert "No space left on device" in error(outputs), outputs


def test_no_network(make_worker):
    outputs = run(
        worker := make_worker(),
        "import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=3)",
    )
    assert "OSError" in error(outputs) or "unreachable" in error(outputs), outputs
    worker.kill()


def test_a_submitted_file_cannot_shadow_a_module(make_worker):
    worker = make_worker({"ptcourse.py": "raise SystemExit('shadowed')", "torch.py": "x = 1"})
    outputs = run(worker, "import torch, ptcourse.core.measure\nprint(hasattr(torch, 'randn'))")
    assert printed(outputs) == "True\n", outputs


def test_memory_limit(make_worker):
    worker = make_worker(memory_bytes=6 * 2**30)
    outputs = run(worker, "import torch\nx = torch.ones(8 * 2**30, dtype=torch.uint8)")
    assert "RuntimeError" in error(outputs) or "MemoryError" in error(outputs), outputs


def test_every_process_dies_with_the_sandbox(make_worker):
    worker = make_worker()
    run(
        worker,
        "import subprocess\n"
        "subprocess.Popen(['sleep', '600'], start_new_session=True)\n"
        "subprocess.Popen(['sh', '-c', 'sleep 601 & sleep 602'], start_new_session=True)",
    )
    pids = process_tree(worker.process.pid)
    assert len(pids) >= 4
    worker.kill()
    time.sleep(0.5)
    alive = [pid for pid in pids if os.path.exists(f"/proc/{pid}")]
    states = [Path(f"/proc/{pid}/stat").read_text().split()[2] for pid in alive]
    assert all(state == "Z" for state in states), (alive, states)


@pytest.mark.parametrize("sandboxed", [True, False])
def test_unsandboxed_workers_still_get_private_folders(make_worker, sandboxed):
    worker = make_worker({"a.txt": "x"}, sandboxed=sandboxed)
    outputs = run(worker, "import os\nprint(os.path.exists('a.txt'), os.environ['HOME'])")
    exists, home = printed(outputs).split()
    assert exists == "True" and "home" in home and not home.startswith("/root/"), outputs


def test_a_fork_bomb_meets_the_process_limit(make_worker):
    from ptcourse.judge import accounting

    probe = accounting.for_sandbox(1)
    probe.release()
    if not probe.exact:
        pytest.skip("no control group can be made here")
    worker = make_worker(processes=64)
    outputs = run(
        worker,
        "import subprocess\n"
        "children = []\n"
        "try:\n"
        "    for _ in range(200):\n"
        "        children.append(subprocess.Popen(['sleep', '60']))\n"
        "except OSError as error:\n"
        "    print('stopped at', len(children), type(error).__name__)\n",
    )
    assert "stopped at" in printed(outputs), outputs
    assert int(printed(outputs).split()[2]) < 64


def test_a_hidden_folder_that_does_not_exist_is_left_out(tmp_path):
    """bwrap cannot make a mount point inside a read-only checkout: a fresh clone has no
    build/ folder, and hiding it failed every worker at start."""
    from ptcourse.judge import sandbox

    missing = tmp_path / "checkout" / "build"
    (tmp_path / "checkout").mkdir()
    argv = sandbox.command(
        ["python"], submission=tmp_path, readable=[tmp_path / "checkout"], hidden=[missing],
        limits=sandbox.limits_from_env(), env={},
    )  # fmt: skip
    assert str(missing) not in argv
    missing.mkdir()
    argv = sandbox.command(
        ["python"], submission=tmp_path, readable=[tmp_path / "checkout"], hidden=[missing],
        limits=sandbox.limits_from_env(), env={},
    )  # fmt: skip
    assert str(missing) in argv
