"""The judge's side of the worker: start it in its sandbox, talk to it, freeze it, time it.

Only data comes back (``torch.load(weights_only=True)``); a function, module or iterator the
submission defined comes back as a :class:`Remote` that forwards calls to the worker. Elapsed
time is measured here, never reported by the worker: :class:`RemoteCall` sends fresh inputs,
lets the worker run, and charges the call the larger of the wall time and the CPU time every
process of the sandbox used meanwhile (so extra threads or helper processes cannot buy speed).
Between its turns every process of the submission is stopped (SIGSTOP), so nothing it left
running can slow the baseline down.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import select
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ptcourse.core.measure import TimedElsewhere
from ptcourse.grading.checks import SubmissionGone
from ptcourse.judge import sandbox
from ptcourse.judge.worker import HEADER

MAX_REPLY_BYTES = 2**30
STARTUP_S = 180.0  # importing torch and IPython on a loaded machine


class WorkerError(RuntimeError):
    """The submission's code raised in the worker; the message is its exception."""


class WorkerGone(SubmissionGone):
    """The worker died, hung past its deadline or broke the protocol; it has been killed."""


class WorkerLate(WorkerGone):
    """No reply began before the deadline; the worker was left running (``keep_if_late``)."""


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it (the whole sandbox when root is bubblewrap)."""
    tree, found, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(tree.get(pid, ()))
    return found


def cpu_seconds(pids: list[int]) -> float:
    """CPU time the processes' threads have run, from the kernel's scheduler statistics."""
    total = 0
    for pid in pids:
        try:
            tasks = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def rss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, ValueError, IndexError):
            continue
    return total


def _signal_all(pids: list[int], signum: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)


class Pickler(pickle.Pickler):
    """The judge's requests: a :class:`Remote`, or an object mirrored in the worker, travels as
    a reference to the worker's object."""

    def __init__(self, file: io.BytesIO, mirrors: dict[int, tuple[Any, int]]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.mirrors = mirrors

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Remote):
            return obj.ref
        mirrored = self.mirrors.get(id(obj))
        return mirrored[1] if mirrored is not None and mirrored[0] is obj else None


MIRRORED = (torch.nn.Module, torch.optim.Optimizer, torch.Generator)


@dataclass
class WorkerProcess:
    """One sandboxed worker for one submission."""

    submission: Path
    scratch: Path
    env: dict[str, str]
    readable: list[Path]
    hidden: list[Path]
    limits: sandbox.Limits = field(default_factory=sandbox.Limits)
    sandboxed: bool = True
    call_timeout: float = 300.0  # seconds a request may take (the judge sets its cell timeout)
    process: subprocess.Popen | None = None
    frozen: bool = False
    mirrors: dict[int, tuple[Any, int]] = field(default_factory=dict)
    cap: Path | None = None
    trusted: WorkerProcess | None = None
    answered: bool = False  # it has answered since it was launched

    def start(self) -> WorkerProcess:
        return self.launch().ready()

    def launch(self) -> WorkerProcess:
        """Start the process; :meth:`ready` waits until it answers."""
        argv = [sys.executable, "-I", "-m", "ptcourse.judge.worker"]
        env = {**self.env, "PTCOURSE_SUBMISSION": str(self.submission)}
        if self.sandboxed:
            env["PTCOURSE_SUBMISSION"] = sandbox.SUBMISSION
            argv = sandbox.command(
                argv,
                submission=self.submission,
                readable=self.readable,
                hidden=self.hidden,
                limits=self.limits,
                env=env,
            )
            cwd, environ = None, None
        else:
            argv, environ, cwd = sandbox.unsandboxed(
                argv, scratch=self.scratch, submission=self.submission, env=env
            )
        self.scratch.mkdir(parents=True, exist_ok=True)
        log = (self.scratch / "worker.log").open("ab")
        self.cap = sandbox.process_cap(self.limits.processes) if self.sandboxed else None
        procs = str(self.cap / "cgroup.procs") if self.cap else None
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=cwd,
            env=environ,
            start_new_session=True,
            preexec_fn=(lambda: _join(procs)) if procs else None,  # before exec: no race
        )
        log.close()
        self.frozen = False
        self.mirrors = {}
        self.answered = False
        return self

    def ready(self) -> WorkerProcess:
        if not self.answered:
            self.request("ping", timeout=STARTUP_S)  # cell deadlines start once it is ready
            self.answered = True
        return self

    def twin(self, wait: bool = True) -> WorkerProcess:
        """A worker in the same sandbox, with the same limits and environment, that runs no
        submission code: the judge times the baseline and the reference there, so that what
        the sandbox costs (or saves) is the same on both sides of a ratio. Started on first use,
        killed with this worker. It does not run the notebook's setup cell: a check whose lab
        pins glibc's heap there (Labs 04 and 06: ``measure.rss_follows_tensors``) pins the
        twin's too, or allocations cost differently on the two sides (pinned in the twin only,
        Lab 01's baseline copy measured 1.7x over the baseline). ``wait=False`` starts it
        without waiting for it: it boots beside the worker."""
        if self.trusted is None or self.trusted.process is None:
            empty = self.scratch / "twin-submission"
            empty.mkdir(parents=True, exist_ok=True)
            self.trusted = WorkerProcess(
                empty, self.scratch / "twin", self.env, self.readable,
                [*self.hidden, self.submission], self.limits, self.sandboxed, self.call_timeout,
            ).launch()  # fmt: skip
        return self.trusted.ready() if wait else self.trusted

    def mirror(self, *objs: Any) -> None:
        """Send modules, optimizers and generators once; later requests pass the worker's copy,
        the one that runs, and calls copy its state back. New ones travel in one message, so an
        optimizer and its model's parameters stay the same tensors there."""
        new = [obj for obj in objs if id(obj) not in self.mirrors]
        if new:
            for obj, remote in zip(new, self.request("keep_each", new), strict=True):
                self.mirrors[id(obj)] = (obj, remote.ref)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pids(self) -> list[int]:
        return process_tree(self.process.pid) if self.process else []

    def freeze(self) -> None:
        if self.process and not self.frozen:
            _signal_all(self.pids, signal.SIGSTOP)
            self.frozen = True

    def thaw(self) -> None:
        if self.process and self.frozen:
            _signal_all(self.pids, signal.SIGCONT)
            self.frozen = False

    def interrupt(self) -> None:
        """KeyboardInterrupt in the worker (a cell past its time)."""
        self.thaw()
        for pid in self.pids:
            if _python_of(pid):
                _signal_all([pid], signal.SIGINT)

    def kill(self) -> None:
        if self.trusted is not None:
            self.trusted.kill()
        if self.process is None:
            return
        _signal_all(self.pids, signal.SIGKILL)
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.process = None
        for _ in range(50):  # the namespace's last processes are reaped asynchronously
            if not self.cap or not (self.cap / "cgroup.procs").read_text().strip():
                break
            time.sleep(0.02)
        sandbox.release_cap(self.cap)
        self.cap = None

    def send(self, op: str, *args: Any) -> None:
        if self.process is None:
            raise WorkerGone("the worker is not running")
        self.thaw()
        buffer = io.BytesIO()
        Pickler(buffer, self.mirrors).dump((op, *args))
        payload = buffer.getvalue()
        try:
            self.process.stdin.write(HEADER.pack(len(payload)) + payload)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            self.kill()
            raise WorkerGone(f"the worker closed its channel ({error})") from error

    def receive(self, timeout: float, keep_if_late: bool = False) -> Any:
        """The next reply; a worker that sends none within ``timeout`` is killed, unless
        ``keep_if_late`` (then :class:`WorkerLate` is raised and the caller may interrupt it)."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno() if self.process else -1
        if keep_if_late and fd >= 0 and not select.select([fd], [], [], timeout)[0]:
            raise WorkerLate(f"no reply within {timeout:g} s")
        try:
            (size,) = HEADER.unpack(self._read(HEADER.size, deadline))
            if size > MAX_REPLY_BYTES:
                raise WorkerGone(f"a reply of {size} bytes (more than {MAX_REPLY_BYTES})")
            with warnings.catch_warnings():  # sparse gradients: invariant-check notices
                warnings.simplefilter("ignore")
                reply = torch.load(io.BytesIO(self._read(size, deadline)), weights_only=True)
        except WorkerGone:
            self.kill()
            raise
        except Exception as error:  # noqa: BLE001 - anything unreadable is a broken worker
            self.kill()
            raise WorkerGone(f"unreadable reply from the worker: {error}") from error
        if not isinstance(reply, dict) or "ok" not in reply:
            self.kill()
            raise WorkerGone("a reply that is not the protocol's")
        if not reply["ok"]:
            raise WorkerError(str(reply.get("error")))
        return self.decode(reply.get("value"))

    def request(self, op: str, *args: Any, timeout: float | None = None) -> Any:
        self.send(op, *args)
        return self.receive(self.call_timeout if timeout is None else timeout)

    def _read(self, size: int, deadline: float) -> bytes:
        fd = self.process.stdout.fileno()
        chunks, left = [], size
        while left:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise WorkerGone(f"no reply from the worker within the deadline ({size} bytes)")
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                code = self.process.poll()
                raise WorkerGone(f"the worker ended (exit status {code})")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def decode(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"__ref__", "type"}:
            return Remote(self, int(value["__ref__"]), str(value["type"]))
        if isinstance(value, list | tuple):
            return type(value)(self.decode(each) for each in value)
        if isinstance(value, dict):
            return {key: self.decode(each) for key, each in value.items()}
        return value


def _join(procs: str) -> None:
    """In the new process, before exec: enter the submission's pids cgroup."""
    with open(procs, "w") as f:
        f.write(str(os.getpid()))


def _python_of(pid: int) -> bool:
    try:
        return "python" in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return False


class Remote:
    """Something the submission defined, living in its worker: call it, read its attributes,
    iterate it. Arguments travel pickled; a module or optimizer passed in is mirrored: sent
    once, the worker's copy is the one later calls use, and after each call its parameters,
    buffers, gradients and state (a generator's too) are copied back into the judge's object (its
    structure is not: a check reads structure through :func:`ptcourse.grading.checks.beside`).
    After each reply the worker is stopped until the judge sends it something again, so nothing
    the submission left running competes with what the judge does meanwhile."""

    def __init__(self, worker: WorkerProcess, ref: int, type_name: str) -> None:
        self.worker, self.ref, self.type_name = worker, ref, type_name

    def __repr__(self) -> str:
        return f"<submission's {self.type_name} (in the sandboxed worker)>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.worker.mirror(*(arg for arg in args if isinstance(arg, MIRRORED)))
        reply = self._request("call", self, args, kwargs, True)
        for arg, state in zip(args, reply["args"] or (), strict=False):
            _apply_state(arg, state)
        return reply["value"]

    def _request(self, op: str, *args: Any) -> Any:
        try:
            return self.worker.request(op, *args)
        finally:
            self.worker.freeze()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return self._request("attribute", self, name)

    def __iter__(self) -> Remote:
        return self._request("call", _ITER, (self,), {}, False)["value"]

    def __next__(self) -> Any:
        step = self._request("next", self)
        if step["done"]:
            raise StopIteration
        return step["value"]

    def timed(
        self,
        make_args: Callable[[], tuple],
        verify: Callable[..., None] | None = None,
        *,
        inference: bool = False,
        via: Callable[..., Any] | None = None,
    ) -> RemoteCall:
        target = self if via is None else functools.partial(via, self)
        return RemoteCall(self.worker, target, make_args, verify, inference)

    def alike(
        self,
        fn: Callable[..., Any],
        make_args: Callable[[], tuple],
        *,
        inference: bool = False,
    ) -> RemoteCall:
        """``fn(*make_args())`` timed as this answer is, in the worker's trusted twin."""
        return RemoteCall(self.worker.twin(), fn, make_args, None, inference)

    def in_twin(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run in the worker's trusted twin (no submission code there)."""
        twin = self.worker.twin()
        try:
            return twin.request("call", fn, args, {}, False)["value"]
        finally:
            twin.freeze()

    def beside(self, fn: Callable[..., Any], *args: Any, keep: bool = False) -> Any:
        """``fn(self, *args)`` run in the worker (``fn`` travels by its module and name); with
        ``keep`` its result stays there and a :class:`Remote` to it comes back."""
        op = "call_and_keep" if keep else "call"
        return self._request(op, fn, (self, *args), {}, False)["value"]


_ITER = iter  # pickled by reference: builtins.iter, resolved in the worker


def _apply_state(arg: Any, state: Any) -> None:
    if state is None:
        return
    if isinstance(arg, torch.nn.Module) and "state" in state:
        _apply_module_state(arg, state["state"], state["grads"])
    elif isinstance(arg, torch.optim.Optimizer) and "optimizer" in state:
        arg.load_state_dict(state["optimizer"])
    elif isinstance(arg, torch.Generator) and "generator" in state:
        arg.set_state(state["generator"])


def _apply_module_state(module: torch.nn.Module, state: dict, grads: dict) -> None:
    """The worker's copy's tensors into the judge's module, as the call left them: a dtype the
    call changed (``model.to(torch.bfloat16)``) is kept, the tensors stay the judge's objects
    (its optimizer still holds them); entries the call added or removed (a structure it
    changed, which a check reads beside the answer) are left out."""
    own = dict(module.named_parameters()) | dict(module.named_buffers())
    with torch.no_grad():
        for name, value in state.items():
            target = own.get(name)
            if target is None or not isinstance(value, torch.Tensor):
                continue
            if target.shape == value.shape and target.dtype == value.dtype:
                target.copy_(value)
            else:
                target.data = value.clone()
    for name, param in module.named_parameters():
        grad = grads.get(name)
        param.grad = None if grad is None else grad.clone().to(param.dtype)


class RemoteCall(TimedElsewhere):
    """A call a speed check times: each timed call gets inputs from ``make_args`` that the
    submission has not seen, the judge's clock runs around the worker's turn, and one output
    per block is checked with ``verify(args, output)`` (raising when wrong)."""

    def __init__(
        self,
        worker: WorkerProcess,
        target: Any,
        make_args: Callable[[], tuple],
        verify: Callable[..., None] | None,
        inference: bool = False,
    ) -> None:
        self.target, self.make_args, self.verify = target, make_args, verify
        self.worker, self.inference = worker, inference
        self.threads = 1

    def _prepare(self, key: str, arg_sets: list[tuple]) -> None:
        # what lasts from call to call is sent once: the target (a model, a runner that builds
        # its session on first call) and stateful arguments (a model and its optimizer)
        lasting = [arg for arg in arg_sets[0] if isinstance(arg, MIRRORED)]
        if not isinstance(self.target, Remote):
            lasting.insert(0, self.target)
        self.worker.mirror(*lasting)
        options = (self.threads, self.inference)
        self.worker.request("prepare", key, self.target, arg_sets, *options)

    def __call__(self) -> Any:
        if isinstance(self.target, Remote):
            return self.target(*self.make_args())
        self._prepare("once", [self.make_args()])
        try:
            self.worker.request("run", "once")
            return self.worker.request("result", "once", 0)
        finally:
            self.worker.freeze()

    def time_block(self, calls: int) -> float:
        """Seconds per call over ``calls`` calls on fresh inputs: max(wall, CPU of the sandbox)."""
        arg_sets = [self.make_args() for _ in range(calls)]
        self._prepare("timed", arg_sets)
        pids = self.worker.pids
        cpu_before = cpu_seconds(pids)
        start = time.perf_counter()
        self.worker.request("run", "timed")
        wall = time.perf_counter() - start
        self.worker.freeze()
        cpu = cpu_seconds(self.worker.pids) - cpu_before
        if self.verify is not None:
            index = int(torch.randint(calls, (1,)))
            self.verify(arg_sets[index], self.worker.request("result", "timed", index))
        return max(wall, cpu) / calls

    def peak_bytes(self, interval_s: float = 0.001) -> tuple[int, int]:
        """(RSS before, peak RSS) of the sandbox's processes during one call on fresh inputs."""
        args = self.make_args()
        self.worker.request("release_memory")
        self._prepare("memory", [args])
        pids = self.worker.pids
        before = peak = rss_bytes(pids)
        self.worker.send("run", "memory")
        fd = self.worker.process.stdout.fileno()
        while not select.select([fd], [], [], interval_s)[0]:
            peak = max(peak, rss_bytes(pids))
        self.worker.receive(timeout=600)
        peak = max(peak, rss_bytes(pids))  # the output is still alive in the worker
        self.worker.freeze()
        output = self.worker.request("result", "memory", 0)
        if self.verify is not None:  # the measured call must have done the work
            self.verify(args, output)
        return before, peak
