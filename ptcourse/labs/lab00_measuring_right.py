"""Simulations for lab 00 (measuring right) that behave the same on every machine.

* :class:`SimulatedDevice` — an asynchronous "device" for the CPU track.
  :meth:`~SimulatedDevice.launch` queues work and returns at once, as a CUDA kernel launch
  does; :meth:`~SimulatedDevice.synchronize` blocks until the work is done, as
  ``torch.cuda.synchronize()`` does; :meth:`~SimulatedDevice.record` returns an :class:`Event`
  with ``elapsed_time`` in milliseconds, as ``torch.cuda.Event`` does. An error inside a work
  item surfaces at the next ``synchronize()``, again as on a GPU.
* :func:`kernel` and :func:`warming` — work of known duration. It waits instead of computing:
  waiting takes the same time on an idle and on a busy machine, so a grader knows the true
  duration (a hidden test draws it from a secret seed). Kernels run on a virtual timeline, not
  on a thread: a launch wakes nothing, so it cannot be delayed by the OS scheduler handing the
  CPU to another thread (a thread-based queue was, by 5-15 ms, on a loaded 2-core machine).
* :func:`busy_cores` — start CPU-bound neighbour processes for a while, to show what a shared
  machine does to a measurement.
* :func:`timer_error` — what lab 00's hidden tests grade: how far a student's timer lands from
  ptcourse's own measurement of the same workload.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ptcourse.core import measure
from ptcourse.core.smoke import pick
from ptcourse.grading.targets import CPU_VM, Target

Work = Callable[[], Any]
_STOP = object()
_names = itertools.count()


@dataclass(frozen=True)
class Kernel:
    """A work item of known duration. Called directly it simply takes ``seconds`` (it sleeps);
    launched on a :class:`SimulatedDevice` it occupies the device for ``seconds``."""

    seconds: float

    def __post_init__(self) -> None:
        if not self.seconds >= 0:
            raise ValueError("seconds must be >= 0")

    def __call__(self) -> None:
        time.sleep(self.seconds)


def kernel(seconds: float) -> Kernel:
    """A kernel that takes ``seconds``; machine load does not change it (it is a sleep)."""
    return Kernel(float(seconds))


def _sleep_until(deadline: float) -> None:
    while (left := deadline - time.perf_counter()) > 0:
        time.sleep(left)


class Event:
    """A marker in a device's stream of work; it is reached when the work before it is done."""

    def __init__(self, time_s: float | None = None) -> None:
        self._done = threading.Event()
        self.time_s = time_s  # known at once when only kernels are ahead of it
        if time_s is not None:
            self._done.set()

    def _stamp(self) -> None:
        self.time_s = time.perf_counter()
        self._done.set()

    def query(self) -> bool:
        """True once the device has reached this event (it never blocks)."""
        return self._done.is_set() and time.perf_counter() >= (self.time_s or 0.0)

    def synchronize(self) -> None:
        """Block until the device reaches this event."""
        self._done.wait()
        _sleep_until(self.time_s or 0.0)

    def elapsed_time(self, end: Event) -> float:
        """Milliseconds from this event to ``end`` (both must be reached), like CUDA events."""
        if not (self.query() and end.query()):
            raise RuntimeError("both events must be reached first: call end.synchronize()")
        return (end.time_s - self.time_s) * 1e3  # type: ignore[operator]


class SimulatedDevice:
    """An asynchronous device: launched work runs later, in launch order.

    A :class:`Kernel` (from :func:`kernel`) occupies the device's timeline for its duration
    without any thread doing the waiting, so ``launch`` returns in about a microsecond and no
    thread wakes up while your code runs, just as with a GPU. Any other callable runs on the
    device's worker thread, in order with the kernels around it; an exception it raises
    surfaces at the next :meth:`synchronize`, as a GPU error does.

    Use it as a context manager (``with SimulatedDevice() as dev:``) or call :meth:`close`;
    the worker is a daemon thread, so a forgotten device never keeps Python alive.
    """

    def __init__(self, name: str | None = None) -> None:
        self.name = name or f"sim{next(_names)}"
        self._lock = threading.Lock()
        self._busy_until = 0.0  # when the kernels on the timeline are done
        self._ends: list[float] = []  # end times of timeline kernels, for ``pending``
        self._queue: queue.Queue[Any] = queue.Queue()  # used while callables are in flight
        self._error: BaseException | None = None
        self._closed = False
        self.launched = 0
        self._worker = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._worker.start()

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                with self._lock:
                    start = self._busy_until
                _sleep_until(start)
                if isinstance(item, Event):
                    item._stamp()
                elif isinstance(item, Kernel):
                    time.sleep(item.seconds)
                elif self._error is None:  # after an error the rest of the stream is skipped
                    item()
            except BaseException as error:  # kept for synchronize(); never printed here
                self._error = error
            finally:
                with self._lock:
                    self._busy_until = max(self._busy_until, time.perf_counter())
                self._queue.task_done()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"device {self.name} is closed")

    def launch(self, work: Work) -> None:
        """Queue ``work`` and return immediately; it runs later, on the device."""
        self._check_open()
        self.launched += 1
        if isinstance(work, Kernel) and self._queue.unfinished_tasks == 0:
            now = time.perf_counter()
            with self._lock:
                self._busy_until = max(self._busy_until, now) + work.seconds
                self._ends = [end for end in self._ends if end > now]
                self._ends.append(self._busy_until)
        else:
            self._queue.put(work)

    def record(self) -> Event:
        """Queue a timing event (like ``torch.cuda.Event(enable_timing=True).record()``)."""
        self._check_open()
        if self._queue.unfinished_tasks == 0:
            with self._lock:
                return Event(max(self._busy_until, time.perf_counter()))
        event = Event()
        self._queue.put(event)
        return event

    @property
    def pending(self) -> int:
        """Work items launched that have not finished yet."""
        now = time.perf_counter()
        with self._lock:
            kernels = sum(end > now for end in self._ends)
        return kernels + self._queue.unfinished_tasks

    def synchronize(self) -> None:
        """Block until all launched work has finished; re-raise a work item's error."""
        self._queue.join()
        with self._lock:
            until = self._busy_until
        _sleep_until(until)
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"a work item on {self.name} failed: {error!r}") from error

    def close(self) -> None:
        """Let queued work finish and stop the worker (idempotent); errors are not re-raised."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._worker.join()

    def __enter__(self) -> SimulatedDevice:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{self.pending} pending"
        return f"SimulatedDevice({self.name!r}, {state})"


def warming(first_s: float, steady_s: float, slow_calls: int = 1) -> Work:
    """A callable whose first ``slow_calls`` calls take ``first_s`` and later ones ``steady_s``.

    It stands for one-off costs such as loading a library, allocating a cache or compiling a
    kernel. Each call of :func:`warming` returns a fresh, cold callable.
    """
    if first_s < 0 or steady_s < 0 or slow_calls < 0:
        raise ValueError("durations and slow_calls must be >= 0")
    calls = 0

    def work() -> None:
        nonlocal calls
        calls += 1
        time.sleep(first_s if calls <= slow_calls else steady_s)

    return work


@contextlib.contextmanager
def busy_cores(n: int, max_seconds: float = 120.0) -> Iterator[list[subprocess.Popen]]:
    """Run ``n`` CPU-bound neighbour processes while the block runs.

    Each neighbour also stops by itself after ``max_seconds``, so none outlives a crashed
    kernel for long. Their output goes nowhere (nothing reaches this process's stderr).
    """
    code = (
        "import time\n"
        f"end = time.monotonic() + {float(max_seconds)!r}\n"
        "while time.monotonic() < end: pass\n"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(max(0, n))
    ]
    try:
        time.sleep(0.05 if procs else 0)  # let them start spinning
        yield procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait()


def neighbours_for_contention() -> int:
    """How many busy neighbours leave exactly one core free here (at least 1, at most 15)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 2
    return min(15, max(1, cores - 1))


@dataclass(frozen=True)
class TimerError:
    """A timer's answers against ptcourse's measurements of the same workload, round by round."""

    error: float  # median over rounds of the relative distance from the reference interval
    answers_s: tuple[float, ...]
    intervals_s: tuple[tuple[float, float], ...]
    errors: tuple[float, ...]

    @property
    def timer_s(self) -> float:
        return float(np.median(self.answers_s))

    def summary(self) -> str:
        fmt = measure._fmt_time
        lines = [
            f"  round {i + 1}: your timer {fmt(answer)} per call; ptcourse {fmt(low)}–{fmt(high)}"
            f" → relative error {error:.3g}"
            for i, (answer, (low, high), error) in enumerate(
                zip(self.answers_s, self.intervals_s, self.errors, strict=True)
            )
        ]
        return "\n".join([*lines, f"  median relative error over the rounds: {self.error:.3g}"])


def _relative_distance(value: float, low: float, high: float) -> float:
    if value < low:
        return (low - value) / low
    if value > high:
        return (value - high) / high
    return 0.0


def timer_error(
    timer: Callable[..., float],
    make_workload: Callable[[], tuple[Work, Work]],
    *,
    warmup: int = 3,
    repeats: int = 20,
    threads: int = 1,
    rounds: int = 3,
    min_run_time: float | None = None,
) -> TimerError:
    """Run ``timer(fn, sync=sync, warmup=, repeats=)`` on fresh workloads and grade its answers.

    ``make_workload()`` returns a new, cold ``(fn, sync)`` pair each time it is called. The
    reference is :func:`ptcourse.core.measure.time_callable` of ``fn(); sync()`` on its own fresh
    workload. References and the timer under test alternate (ref, timer, ref, timer, …, ref);
    each answer counts as exact anywhere between the lowest lower quartile and the highest
    upper quartile of the two references beside it — a busier machine widens that interval,
    and a change of load between them is not held against the timer — and the result is the
    median of the ``rounds`` relative distances, so one burst of load cannot decide it.
    Everything runs at ``threads`` torch threads.
    """
    min_run_time = pick(0.5, 0.2) if min_run_time is None else min_run_time

    def reference() -> tuple[float, float]:
        fn, sync = make_workload()

        def call() -> None:
            fn()
            sync()

        timing = measure.time_callable(
            call, threads=threads, warmup=warmup, min_run_time=min_run_time
        )
        q25, q75 = np.percentile(np.asarray(timing.times_s or (timing.median_s,)), [25, 75])
        return float(q25), float(q75)

    previous = reference()
    answers, intervals, errors = [], [], []
    for _ in range(rounds):
        fn, sync = make_workload()
        with measure.pinned_threads(threads):
            answer = float(timer(fn, sync=sync, warmup=warmup, repeats=repeats))
        following = reference()
        low, high = min(previous[0], following[0]), max(previous[1], following[1])
        answers.append(answer)
        intervals.append((low, high))
        errors.append(_relative_distance(answer, low, high))
        previous = following
    result = TimerError(float(np.median(errors)), tuple(answers), tuple(intervals), tuple(errors))
    print(result.summary())
    return result


# One block per lab, filled from that lab's measurements.
# Lab 00: the hidden tests grade how far a student's timer lands from ptcourse's own measurement
# (async_device.timer_error: median over 3 rounds of the relative distance from the reference's
# quartile interval). Measured 2026-12-02, 15 runs each at full and smoke size, with one busy
# neighbour process plus other sessions' load (load average 2-10 on 2 cores).
LAB00_TIMING = "reference rounds interleaved with ptcourse's measurement; 15 full + 15 smoke runs"
TARGETS: tuple[Target, ...] = (
    Target("00", "time_it_compute", "cpu", "relative_error", 0.3, 0.75,
           "median 0, max 0.053 (full) / 0.036 (smoke): matmul n in [448, 576], 1 thread",
           "naive one-call timer 0-0.27 (not meant to fail this check)",
           f"{CPU_VM}; {LAB00_TIMING}", "2026-12-02"),
    Target("00", "time_it_warmup", "cpu", "relative_error", 0.3, 1.0,
           "median 0.021, max 0.041 (full); median 0.049, max 0.18 (smoke)",
           "naive 2.7-6.1; median timer without warm-up 1.46-5.2",
           f"{CPU_VM}; {LAB00_TIMING}", "2026-12-02"),
    Target("00", "time_it_async", "cpu", "relative_error", 0.3, 0.6,
           "median 0.036, max 0.13 (full); median 0.054, max 0.11 (smoke)",
           "naive 0.998-0.999; timer without sync 0.9997",
           f"{CPU_VM}; {LAB00_TIMING}", "2026-12-02"),
    Target("00", "roofline", "cpu", "score", 1.0, 0.0,
           "1.0 (10 of 10 answers; deterministic)", "unanswered lab: 0",
           "any machine (no timing)", "2026-12-02"),
)  # fmt: skip
