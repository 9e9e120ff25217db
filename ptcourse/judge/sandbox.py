"""A sandbox per submission: bubblewrap (Debian package ``bubblewrap``) around every process that
runs student code, plus resource limits from ``prlimit``.

Inside: the whole file system read-only, with the build folder, the other submissions, ``/home``,
``/root`` and ``/run`` hidden; a private, size-capped ``/tmp`` whose ``/tmp/work`` is HOME,
IPYTHONDIR, TMPDIR and the working directory; the submission's folder read-only at
``/tmp/submission``; no network, its own PID namespace (every process dies with the sandbox),
a new session.
Without bubblewrap (macOS, a container without user namespaces) :func:`unavailable` says why
and the judge marks every score "unsandboxed"; it never downgrades silently.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRATCH = "/tmp/work"
SUBMISSION = "/tmp/submission"
EXCHANGE = "/tmp/exchange"  # the judge's input tensors (ptcourse.judge.remote.Exchange)
HIDDEN = ("/home", "/root", "/run", "/var/tmp", "/mnt", "/media")


@dataclass(frozen=True)
class Limits:
    """What one submission may use: address space, CPU time, open files, file size, disk."""

    memory_bytes: int = 12 * 2**30
    cpu_seconds: int = 3600
    open_files: int = 1024
    file_bytes: int = 2 * 2**30
    scratch_bytes: int = 2 * 2**30
    shm_bytes: int = 2 * 2**30
    processes: int = 256


def limits_from_env() -> Limits:
    """The default limits, with ``PTCOURSE_MEMORY_LIMIT_GB`` and ``PTCOURSE_CPU_LIMIT_S``."""
    memory = float(os.environ.get("PTCOURSE_MEMORY_LIMIT_GB", "12"))
    cpu = int(os.environ.get("PTCOURSE_CPU_LIMIT_S", "3600"))
    return Limits(memory_bytes=int(memory * 2**30), cpu_seconds=cpu)


def unavailable() -> str | None:
    """Why no sandbox can be made here (None: bubblewrap works)."""
    if not sys.platform.startswith("linux"):
        return f"bubblewrap needs Linux (this is {sys.platform})"
    if shutil.which("bwrap") is None:
        return "bubblewrap is not installed (apt install bubblewrap)"
    probe = subprocess.run(
        ["bwrap", "--ro-bind", "/", "/", "--unshare-all", "--die-with-parent", "true"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        return f"bubblewrap cannot create namespaces here: {probe.stderr.strip()[-200:]}"
    return None


def _limits(limits: Limits) -> list[str]:
    return [
        "prlimit",
        f"--as={limits.memory_bytes}",
        f"--cpu={limits.cpu_seconds}",
        f"--nofile={limits.open_files}",
        f"--fsize={limits.file_bytes}",
        "--",
    ]


def command(
    argv: list[str],
    *,
    submission: Path,
    readable: list[Path],
    hidden: list[Path],
    limits: Limits,
    env: dict[str, str],
    exchange: Path | None = None,
) -> list[str]:
    """``argv`` wrapped in bubblewrap and prlimit.

    ``readable``: folders to expose read-only even below a hidden one (the checkout, the venv,
    the datasets); ``hidden``: folders to mask (the build folder, the submissions root).
    """
    wrap = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    for folder in [*HIDDEN, *map(str, hidden)]:
        if Path(folder).exists():
            wrap += ["--tmpfs", folder]
    wrap += ["--size", str(limits.scratch_bytes), "--tmpfs", "/tmp"]
    wrap += ["--size", str(limits.shm_bytes), "--tmpfs", "/dev/shm"]
    for folder in readable:  # after the masks: a checkout may live in /home or /tmp
        wrap += ["--ro-bind", str(folder), str(folder)]
    for folder in hidden:  # a readable folder may contain a hidden one (checkout/build)
        # (one that does not exist hides nothing, and bwrap cannot make its mount point there)
        if Path(folder).exists() and any(Path(folder).is_relative_to(r) for r in readable):
            wrap += ["--tmpfs", str(folder)]
    wrap += ["--dir", SCRATCH]
    wrap += ["--ro-bind", str(submission), SUBMISSION, "--chdir", SCRATCH]
    if exchange is not None:  # written by the judge, read (and writable) here
        wrap += ["--bind", str(exchange), EXCHANGE]
    wrap += ["--unshare-all", "--die-with-parent", "--new-session", "--clearenv"]
    private = {
        "HOME": f"{SCRATCH}/home",
        "IPYTHONDIR": f"{SCRATCH}/ipython",
        "TMPDIR": f"{SCRATCH}/tmp",
        "MPLCONFIGDIR": f"{SCRATCH}/matplotlib",
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }
    for name, value in {**env, **private}.items():
        wrap += ["--setenv", name, value]
    return [*wrap, *_limits(limits), *argv]


def unsandboxed(
    argv: list[str], *, scratch: Path, submission: Path, env: dict[str, str]
) -> tuple[list[str], dict[str, str], Path]:
    """The same process without a sandbox: private folders, but the machine fully reachable."""
    for name in ("home", "ipython", "tmp", "matplotlib"):
        (scratch / name).mkdir(parents=True, exist_ok=True)
    private = {
        "HOME": str(scratch / "home"),
        "IPYTHONDIR": str(scratch / "ipython"),
        "TMPDIR": str(scratch / "tmp"),
        "MPLCONFIGDIR": str(scratch / "matplotlib"),
        "PATH": os.environ.get("PATH", ""),
        "PTCOURSE_SUBMISSION": str(submission),
        "PTCOURSE_SCRATCH": str(scratch),
    }
    return argv, {**env, **private}, scratch
