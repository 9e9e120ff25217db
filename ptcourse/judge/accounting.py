"""What the kernel counts for one sandbox: CPU time, memory and its peak, a freezer and a process
cap, for every process in it, those it forks and those that exit before anyone looks included.

A control group around the sandbox measures the way competitive-programming judges do (isolate's
control-group mode). :func:`for_sandbox` makes one where this machine lets us:

- **cgroup v1** (``/sys/fs/cgroup/{cpuacct,memory,freezer,pids}``, writable by root, as on the
  course's CI machines): ``cpuacct.usage``, ``memory.max_usage_in_bytes`` (reset before each
  reading), ``freezer.state``, ``pids.max``;
- **cgroup v2** (one unified hierarchy and a subtree this process may write: root, or a systemd
  scope with ``Delegate=yes``): ``cpu.stat``, ``memory.peak`` (written to reset it, Linux 6.12
  and later; before that the judge samples ``memory.current``), ``cgroup.freeze``, ``pids.max``.

Elsewhere (macOS, a container that cannot write its cgroups, a JupyterHub pod) :class:`PerProcess`
reads ``/proc`` for the processes it can list and stops them with SIGSTOP; the judge says so on
every graded cell: a process that starts and exits between two readings escapes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from pathlib import Path

V1 = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("cpuacct", "memory", "freezer", "pids")
V2 = Path("/sys/fs/cgroup")


class Accounting:
    """The counters of one sandbox; every method is safe to call after :meth:`release`."""

    kind = ""
    exact = True  # False: per process, forks and short-lived processes can escape

    def join(self) -> None:
        """Enter this process (called in the sandbox's first process, before exec)."""

    def started(self, pid: int) -> None:
        """The sandbox's first process has started (as ``pid``)."""

    def pids(self) -> list[int]:
        raise NotImplementedError

    def cpu_seconds(self) -> float:
        raise NotImplementedError

    def memory_bytes(self) -> int:
        raise NotImplementedError

    def reset_peak(self) -> None:
        """Start a new peak from the memory in use now."""

    def peak_bytes(self) -> int | None:
        """The peak since :meth:`reset_peak`; None where the kernel keeps none (sample)."""
        return None

    def freeze(self) -> None:
        raise NotImplementedError

    def thaw(self) -> None:
        raise NotImplementedError

    def release(self) -> None:
        """Kill what is left and remove the group."""


def _write(path: Path, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read(path: Path) -> str:
    with open(path) as f:
        return f.read()


def _wait_for(done, what: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the control group did not {what} within {timeout_s:g} s")
        time.sleep(0.0005)


class CgroupV1(Accounting):
    kind = "cgroup v1 (cpuacct, memory, freezer, pids)"

    def __init__(self, root: Path, processes: int) -> None:
        name = f"ptcourse-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.dirs = {c: root / c / name for c in V1_CONTROLLERS}
        made = []
        try:
            for folder in self.dirs.values():
                folder.mkdir()
                made.append(folder)
            _write(self.dirs["pids"] / "pids.max", str(processes))
        except OSError:
            for folder in reversed(made):
                with contextlib.suppress(OSError):
                    folder.rmdir()
            raise

    def join(self) -> None:
        pid = str(os.getpid())
        for folder in self.dirs.values():
            _write(folder / "cgroup.procs", pid)

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in _read(self.dirs["pids"] / "cgroup.procs").split()]
        return []

    def cpu_seconds(self) -> float:
        return int(_read(self.dirs["cpuacct"] / "cpuacct.usage")) / 1e9

    def memory_bytes(self) -> int:
        return int(_read(self.dirs["memory"] / "memory.usage_in_bytes"))

    def reset_peak(self) -> None:
        _write(self.dirs["memory"] / "memory.max_usage_in_bytes", "0")

    def peak_bytes(self) -> int | None:
        return int(_read(self.dirs["memory"] / "memory.max_usage_in_bytes"))

    def freeze(self) -> None:
        state = self.dirs["freezer"] / "freezer.state"
        _write(state, "FROZEN")
        _wait_for(lambda: _read(state).strip() == "FROZEN", "freeze")

    def thaw(self) -> None:
        _write(self.dirs["freezer"] / "freezer.state", "THAWED")

    def release(self) -> None:
        with contextlib.suppress(OSError):
            self.thaw()
        for _ in range(200):
            left = self.pids()
            if not left:
                break
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        for folder in self.dirs.values():
            with contextlib.suppress(OSError):
                folder.rmdir()


class CgroupV2(Accounting):
    kind = "cgroup v2 (cpu, memory, freeze, pids)"

    def __init__(self, folder: Path, processes: int) -> None:
        """A group in ``folder`` (made by :meth:`make`)."""
        self.dir = folder
        if not (folder / "memory.current").exists() or not (folder / "cpu.stat").exists():
            raise OSError("the parent group does not delegate the memory and cpu controllers")
        _write(folder / "pids.max", str(processes))
        self._resettable = True
        self.reset_peak()

    @classmethod
    def make(cls, parent: Path, processes: int) -> CgroupV2:
        folder = parent / f"ptcourse-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        folder.mkdir()
        try:
            return cls(folder, processes)
        except OSError:
            folder.rmdir()
            raise

    def join(self) -> None:
        _write(self.dir / "cgroup.procs", str(os.getpid()))

    def pids(self) -> list[int]:
        with contextlib.suppress(OSError):
            return [int(p) for p in _read(self.dir / "cgroup.procs").split()]
        return []

    def cpu_seconds(self) -> float:
        for line in _read(self.dir / "cpu.stat").splitlines():
            key, _, value = line.partition(" ")
            if key == "usage_usec":
                return int(value) / 1e6
        raise OSError("cpu.stat has no usage_usec")

    def memory_bytes(self) -> int:
        return int(_read(self.dir / "memory.current"))

    def reset_peak(self) -> None:
        if self._resettable:
            try:
                _write(self.dir / "memory.peak", "0")
            except OSError:
                self._resettable = False

    def peak_bytes(self) -> int | None:
        return int(_read(self.dir / "memory.peak")) if self._resettable else None

    def freeze(self) -> None:
        _write(self.dir / "cgroup.freeze", "1")
        _wait_for(lambda: "frozen 1" in _read(self.dir / "cgroup.events"), "freeze")

    def thaw(self) -> None:
        _write(self.dir / "cgroup.freeze", "0")

    def release(self) -> None:
        with contextlib.suppress(OSError):
            _write(self.dir / "cgroup.kill", "1")
        for _ in range(200):
            if not self.pids():
                break
            time.sleep(0.01)
        with contextlib.suppress(OSError):
            self.dir.rmdir()


class PerProcess(Accounting):
    """No control group here: the processes below the sandbox's first one, read from ``/proc``,
    stopped with SIGSTOP."""

    kind = "per process (/proc; no control group could be made here)"
    exact = False

    def __init__(self) -> None:
        self.root: int | None = None

    def started(self, pid: int) -> None:
        self.root = pid

    def pids(self) -> list[int]:
        return process_tree(self.root) if self.root else []

    def cpu_seconds(self) -> float:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError):
                for tid in os.listdir(f"/proc/{pid}/task"):
                    with contextlib.suppress(OSError, ValueError, IndexError):
                        total += int(_read(Path(f"/proc/{pid}/task/{tid}/schedstat")).split()[0])
        return total / 1e9

    def memory_bytes(self) -> int:
        total = 0
        for pid in self.pids():
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(_read(Path(f"/proc/{pid}/statm")).split()[1]) * os.sysconf(
                    "SC_PAGE_SIZE"
                )
        return total

    def freeze(self) -> None:
        _signal_all(self.pids(), signal.SIGSTOP)

    def thaw(self) -> None:
        _signal_all(self.pids(), signal.SIGCONT)

    def release(self) -> None:
        _signal_all(self.pids(), signal.SIGKILL)


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, ()))
    return found


def _own_v2_group() -> Path | None:
    with contextlib.suppress(OSError):
        for line in _read(Path("/proc/self/cgroup")).splitlines():
            if line.startswith("0::"):
                return V2 / line[3:].strip().lstrip("/")
    return None


def for_sandbox(processes: int) -> Accounting:
    """A control group for one sandbox (v1, then v2), or per-process accounting where this
    machine lets us make neither. ``PTCOURSE_ACCOUNTING=proc`` asks for the last (tests)."""
    if os.environ.get("PTCOURSE_ACCOUNTING") != "proc":
        if all((V1 / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
            with contextlib.suppress(OSError):
                return CgroupV1(V1, processes)
        parent = _own_v2_group() if (V2 / "cgroup.controllers").exists() else None
        if parent is not None:
            with contextlib.suppress(OSError):
                return CgroupV2.make(parent, processes)
    return PerProcess()
