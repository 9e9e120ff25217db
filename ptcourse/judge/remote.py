"""The judge's side of the worker: start it in its sandbox, talk to it, freeze it, time it.

Only data comes back (:mod:`ptcourse.judge.wire`); a function, module or iterator the
submission defined comes back as a :class:`Remote` that forwards calls to the worker. The worker
is the submission's: its code, its objects and its replies are the student's, so nothing it
says about itself decides a grade. Elapsed time and memory are measured here, from outside:
:class:`RemoteCall` hands a block of fresh inputs over in the message that starts the block,
inside the judge's clock, and the block's outputs come back before the clock stops; the call is
charged the larger of the wall time and the CPU time the kernel counted for the whole sandbox
(its control group: every process in it, those that forked and exited included; see
:mod:`ptcourse.judge.accounting`). Outputs are verified by the check against its own
computation. After every reply the sandbox is frozen (the cgroup freezer: a process forked at
any moment stops too), so nothing the submission left running competes with what the judge does
meanwhile or runs during the baseline's turn.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import pickle
import random
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
from ptcourse.grading.checks import CheckFailed, SubmissionGone
from ptcourse.judge import accounting, sandbox, wire
from ptcourse.judge.worker import EXCHANGE_ENV, HEADER

MAX_REPLY_BYTES = 2**30
STARTUP_S = 180.0  # importing torch and IPython on a loaded machine
# Outputs of a timed block the check verifies, drawn after the block: over a check's eight or
# more blocks, at least 64 outputs (every one where there are fewer), so work skipped on a
# tenth of the calls is caught with probability 1 - 0.9**64 > 0.998 (and 0.9995 over 72).
VERIFIED_PER_BLOCK = 9
# Handing a measured call's output back may use memory (its serialised copy); more than this
# over the memory in use before it means work was left for after the measured call.
HANDING_BACK_SLACK_BYTES = 16 * 2**20


class WorkerError(RuntimeError):
    """The submission's code raised in the worker; the message is its exception."""


class WorkerGone(SubmissionGone):
    """The worker died, hung past its deadline or broke the protocol; it has been killed."""


class WorkerLate(WorkerGone):
    """No reply began before the deadline; the worker was left running (``keep_if_late``)."""


EXCHANGED_BYTES = 2**16  # input tensors this large travel through the exchange file


class Exchange:
    """The judge's side of the worker's exchange file (shared memory where the machine has
    ``/dev/shm``): large input tensors are written there while the worker is frozen, and a
    request carries only their place, so handing a block its inputs inside the judge's clock
    costs no copy through the pipe (Lab 11's 64 requests of images cost 25-30 ms a call that
    way) and no memory of the sandbox (the pages are the judge's)."""

    def __init__(self, folder: Path) -> None:
        shm = Path("/dev/shm")
        base = shm if shm.is_dir() and os.access(shm, os.W_OK) else folder
        self.path = base / f"ptcourse-exchange-{os.getpid()}-{id(self):x}"
        self.path.write_bytes(b"")
        self.offset = 0

    def begin(self) -> None:
        self.offset = 0

    def put(self, tensor: torch.Tensor) -> tuple[str, int, str, tuple[int, ...]]:
        raw = tensor.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
        offset = self.offset
        with open(self.path, "r+b") as f:
            os.pwrite(f.fileno(), memoryview(raw), offset)
        self.offset = offset + (raw.nbytes + 63) // 64 * 64
        return ("exchange", offset, str(tensor.dtype), tuple(tensor.shape))

    def remove(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()


class Pickler(pickle.Pickler):
    """The judge's requests: a :class:`Remote`, or an object mirrored in the worker, travels as
    a reference to the worker's object; a large plain tensor through the :class:`Exchange`."""

    def __init__(
        self,
        file: io.BytesIO,
        mirrors: dict[int, tuple[Any, int]],
        exchange: Exchange | None = None,
    ) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.mirrors, self.exchange = mirrors, exchange

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Remote):
            return obj.ref
        mirrored = self.mirrors.get(id(obj))
        if mirrored is not None and mirrored[0] is obj:
            return mirrored[1]
        if self.exchange is not None and _exchangeable(obj):
            return self.exchange.put(obj)
        return None


def _exchangeable(obj: Any) -> bool:
    """A plain CPU tensor that is large, or a view of a larger storage (pickled, a view carries
    its whole storage: Lab 11's 64 requests, rows of one tensor, made 8 MB a call)."""
    if type(obj) is not torch.Tensor or obj.device.type != "cpu" or obj.requires_grad:
        return False
    if obj.layout != torch.strided:
        return False
    own = obj.numel() * obj.element_size()
    return own >= EXCHANGED_BYTES or obj.untyped_storage().nbytes() > own


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
    accounting: accounting.Accounting | None = None
    exchange: Exchange | None = None
    trusted: WorkerProcess | None = None
    answered: bool = False  # it has answered since it was launched
    replied_at: float = 0.0  # perf_counter() when the last reply was in, before the freeze

    def start(self) -> WorkerProcess:
        return self.launch().ready()

    def launch(self) -> WorkerProcess:
        """Start the process; :meth:`ready` waits until it answers."""
        argv = [sys.executable, "-I", "-m", "ptcourse.judge.worker"]
        self.scratch.mkdir(parents=True, exist_ok=True)
        self.exchange = Exchange(self.scratch)
        env = {**self.env, "PTCOURSE_SUBMISSION": str(self.submission)}
        env[EXCHANGE_ENV] = str(self.exchange.path)
        if self.sandboxed:
            env["PTCOURSE_SUBMISSION"] = sandbox.SUBMISSION
            env[EXCHANGE_ENV] = sandbox.EXCHANGE
            argv = sandbox.command(
                argv,
                submission=self.submission,
                readable=self.readable,
                hidden=self.hidden,
                limits=self.limits,
                env=env,
                exchange=self.exchange.path,
            )
            cwd, environ = None, None
        else:
            argv, environ, cwd = sandbox.unsandboxed(
                argv, scratch=self.scratch, submission=self.submission, env=env
            )
        self.scratch.mkdir(parents=True, exist_ok=True)
        log = (self.scratch / "worker.log").open("ab")
        self.accounting = accounting.for_sandbox(self.limits.processes)
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            cwd=cwd,
            env=environ,
            start_new_session=True,
            preexec_fn=self.accounting.join,  # in the child before exec: nothing escapes
        )
        self.accounting.started(self.process.pid)
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
        return self.accounting.pids() if self.process and self.accounting else []

    def freeze(self) -> None:
        """Stop every process of the sandbox (it is not the submission's turn)."""
        if self.process and not self.frozen:
            self.accounting.freeze()
            self.frozen = True

    def thaw(self) -> None:
        if self.process and self.frozen:
            self.accounting.thaw()
            self.frozen = False

    def interrupt(self) -> None:
        """KeyboardInterrupt in the worker (a cell past its time)."""
        self.thaw()
        for pid in self.pids:
            if _python_of(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)

    def kill(self) -> None:
        if self.trusted is not None:
            self.trusted.kill()
        if self.process is None:
            return
        self.accounting.release()  # every process of the sandbox, then the group
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                stream.close()
        self.process = None
        self.exchange.remove()

    def encode(self, op: str, *args: Any, exchange: bool = False) -> bytes:
        """A request as the bytes :meth:`send_bytes` sends. With ``exchange`` (a measured
        block's inputs, made while the worker is frozen) its large tensors go to the exchange
        file, rewritten for every block: never for what lasts in the worker (a mirrored model,
        a kept object), which would then change under it."""
        buffer = io.BytesIO()
        self.exchange.begin()
        Pickler(buffer, self.mirrors, self.exchange if exchange else None).dump((op, *args))
        return buffer.getvalue()

    def send(self, op: str, *args: Any) -> None:
        self.send_bytes(self.encode(op, *args))

    def send_bytes(self, payload: bytes) -> None:
        """Thaw the sandbox and hand it one request."""
        if self.process is None:
            raise WorkerGone("the worker is not running")
        self.thaw()
        try:
            self.process.stdin.write(HEADER.pack(len(payload)) + payload)
            self.process.stdin.flush()
        except (BrokenPipeError, OSError) as error:
            self.kill()
            raise WorkerGone(f"the worker closed its channel ({error})") from error

    def receive(self, timeout: float, keep_if_late: bool = False) -> Any:
        """The next reply, after which the sandbox is frozen until the next request; a worker
        that sends none within ``timeout`` is killed, unless ``keep_if_late`` (then
        :class:`WorkerLate` is raised and the caller may interrupt it)."""
        return self.decode_reply(self.receive_raw(timeout, keep_if_late))

    def receive_raw(self, timeout: float, keep_if_late: bool = False) -> bytearray:
        """The next reply's bytes, as they arrived (the judge's clock stops here); frozen."""
        deadline = time.monotonic() + timeout
        fd = self.process.stdout.fileno() if self.process else -1
        if keep_if_late and fd >= 0 and not select.select([fd], [], [], timeout)[0]:
            raise WorkerLate(f"no reply within {timeout:g} s")
        try:
            (size,) = HEADER.unpack(self._read(HEADER.size, deadline))
            if size > MAX_REPLY_BYTES:
                raise WorkerGone(f"a reply of {size} bytes (more than {MAX_REPLY_BYTES})")
            raw = self._read(size, deadline)
        except WorkerGone:
            self.kill()
            raise
        self.replied_at = time.perf_counter()  # before the freeze, whose latency is not the call's
        self.freeze()
        return raw

    def decode_reply(self, raw: bytearray) -> Any:
        """A reply's value: data only, read without running code (:mod:`ptcourse.judge.wire`)."""
        try:
            with warnings.catch_warnings():  # sparse gradients: invariant-check notices
                warnings.simplefilter("ignore")
                reply = wire.loads(raw)
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

    def _read(self, size: int, deadline: float) -> bytearray:
        fd = self.process.stdout.fileno()
        data, done = bytearray(size), 0
        view = memoryview(data)
        while done < size:
            wait = deadline - time.monotonic()
            if wait <= 0 or not select.select([fd], [], [], wait)[0]:
                raise WorkerGone(f"no reply from the worker within the deadline ({size} bytes)")
            got = os.readv(fd, [view[done : done + (1 << 20)]])
            if not got:
                code = self.process.poll()
                raise WorkerGone(f"the worker ended (exit status {code})")
            done += got
        return data

    def decode(self, value: Any) -> Any:
        if isinstance(value, dict) and set(value) == {"__ref__", "type"}:
            return Remote(self, int(value["__ref__"]), str(value["type"]))
        if isinstance(value, list | tuple):
            return type(value)(self.decode(each) for each in value)
        if isinstance(value, dict):
            return {key: self.decode(each) for key, each in value.items()}
        return value


def _python_of(pid: int) -> bool:
    try:
        return "python" in Path(f"/proc/{pid}/comm").read_text()
    except OSError:
        return False


class Remote:
    """Something the submission defined, living in its worker (a
    :class:`ptcourse.grading.protocol.Place`): call it, read its attributes,
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
        if verify is None:
            raise ValueError("a measured call of the submission needs a verifier of its outputs")
        target = self if via is None else functools.partial(via, self)
        return RemoteCall(self.worker, target, make_args, verify, inference)

    def timed_alike(
        self,
        fn: Callable[..., Any],
        make_args: Callable[[], tuple],
        *,
        inference: bool = False,
    ) -> RemoteCall:
        """``fn(*make_args())`` timed as this answer is, in the worker's trusted twin."""
        return RemoteCall(self.worker.twin(), fn, make_args, None, inference)

    def run_alike(self, fn: Callable[..., Any], *args: Any) -> Any:
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
    """A call a speed or memory check measures. Each call gets inputs from ``make_args`` that
    the submission has not seen, handed over in the message that starts its block, inside the
    judge's clock; the block's outputs come back before the clock stops, and ``verify(args,
    output)`` (raising when wrong) checks :data:`VERIFIED_PER_BLOCK` of them drawn after the
    block, or every one, in order, where the verifier says it ``sees_every_call`` (a replay of
    a training step). The output of a memory-measured call is verified too."""

    def __init__(
        self,
        worker: WorkerProcess,
        target: Any,
        make_args: Callable[[], tuple],
        verify: Callable[..., None] | None,
        inference: bool = False,
    ) -> None:
        """``verify`` None: the call runs the course's own code in the trusted twin."""
        self.target, self.make_args, self.verify = target, make_args, verify
        self.worker, self.inference = worker, inference
        self.threads = 1
        self.draw = random.SystemRandom()

    def _payload(self, op: str, arg_sets: list[tuple]) -> bytes:
        """The request for ``op`` on ``arg_sets``, made before any clock starts. What lasts from
        call to call is sent once, before: the target (a model, a runner that builds its
        session on first call) and stateful arguments (a model and its optimizer)."""
        lasting = [arg for arg in arg_sets[0] if isinstance(arg, MIRRORED)]
        if not isinstance(self.target, Remote):
            lasting.insert(0, self.target)
        self.worker.mirror(*lasting)
        options = (self.threads, self.inference)
        return self.worker.encode(op, self.target, arg_sets, *options, exchange=True)

    def _check(self, arg_sets: list[tuple], outputs: Any) -> None:
        if self.verify is None:  # the trusted twin's own code (a baseline, a reference)
            return
        if not isinstance(outputs, list) or len(outputs) != len(arg_sets):
            raise CheckFailed(f"{len(arg_sets)} calls did not hand back {len(arg_sets)} outputs")
        if getattr(self.verify, "sees_every_call", False):
            chosen = range(len(arg_sets))
        else:
            count = min(len(arg_sets), VERIFIED_PER_BLOCK)
            chosen = sorted(self.draw.sample(range(len(arg_sets)), count))
        for index in chosen:
            self.verify(arg_sets[index], outputs[index])

    def __call__(self) -> Any:
        args = self.make_args()
        if isinstance(self.target, Remote):
            output = self.target(*args)
        else:
            self.worker.send_bytes(self._payload("run", [args]))
            output = self.worker.receive(self.worker.call_timeout)[0]
        self._check([args], [output])
        return output

    def time_block(self, calls: int) -> float:
        """Seconds per call over ``calls`` calls on fresh inputs: the larger of the wall time
        and the CPU time of the whole sandbox, from handing the inputs over to having every
        output back."""
        arg_sets = [self.make_args() for _ in range(calls)]
        payload = self._payload("run", arg_sets)
        cpu_before = self.worker.accounting.cpu_seconds()  # frozen: nothing runs meanwhile
        start = time.perf_counter()
        self.worker.send_bytes(payload)
        raw = self.worker.receive_raw(self.worker.call_timeout)  # frozen again on return
        # The wall clock stops when the reply is in; freezing the sandbox after it takes longer
        # the more tasks the notebook left there (Lab 01's DataLoader workers): counted, it made
        # the solution's blocks 12-38 ms per call beside the same code's 11-14 ms in the twin.
        # The CPU time is read once frozen, so work done after the reply still counts.
        wall = self.worker.replied_at - start
        cpu = self.worker.accounting.cpu_seconds() - cpu_before
        self._check(arg_sets, self.worker.decode_reply(raw))
        return max(wall, cpu) / calls

    def peak_bytes(self, interval_s: float = 0.001) -> tuple[int, int]:
        """(memory before, peak memory) of the whole sandbox around one call on fresh inputs.
        The output stays in the worker until the peak is read, then comes back and is verified;
        where handing it back needs more than its copy and some slack, the work was left for
        then, and the peak of handing back counts."""
        args = self.make_args()
        self.worker.request("release_memory")
        payload = self._payload("keep", [args])
        before, peak = self._peak_around(lambda: self.worker.send_bytes(payload), interval_s)
        settled = self.worker.accounting.memory_bytes()
        handed = {}
        _, back = self._peak_around(lambda: self.worker.send("result"), interval_s, handed)
        allowance = 3 * _tensor_bytes(handed["value"]) + HANDING_BACK_SLACK_BYTES
        if back - settled > allowance:
            peak = max(peak, back)
        self._check([args], [handed["value"]])
        return before, peak

    def _peak_around(
        self, send: Callable[[], None], interval_s: float, reply: dict | None = None
    ) -> tuple[int, int]:
        """(memory before, peak) of the sandbox from ``send()`` to its reply: the kernel's peak
        where it keeps one, else sampled every ``interval_s``."""
        account = self.worker.accounting
        account.reset_peak()
        before = peak = account.memory_bytes()
        send()
        fd = self.worker.process.stdout.fileno()
        while not select.select([fd], [], [], interval_s)[0]:
            peak = max(peak, account.memory_bytes())
        value = self.worker.receive(timeout=self.worker.call_timeout)
        kept = account.peak_bytes()
        peak = max(peak, account.memory_bytes(), kept if kept is not None else 0)
        if reply is not None:
            reply["value"] = value
        return before, peak


def _tensor_bytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_tensor_bytes(each) for each in value)
    if isinstance(value, dict):
        return sum(_tensor_bytes(each) for each in value.values())
    return 0
