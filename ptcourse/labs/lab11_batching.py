"""Lab 11, batching: the batch-size curve of a small model, a dynamic batcher with two knobs
(maximum batch size, maximum wait), and graders that replay the student's batching policy in a
simulated queue.

- :func:`build_model` is the small MLP the lab serves; :func:`measure_curve` times one forward
  pass per batch size (one thread, inference mode): the **batch-size curve**, a dict
  ``batch size -> seconds per batch`` that everything else reads. :func:`throughputs` and
  :func:`reference_knee` read it.
- :func:`poisson_trace` draws seeded request arrival times (a numpy ``Generator``; the global
  RNGs are untouched).
- A **batching policy** is data in, decision out (:data:`Dispatch`): given the ages of the
  waiting requests (oldest first) at a moment the model is free, and the two knobs, it returns
  how many of the oldest requests to run now as one batch (0: keep waiting). The same function
  drives the real threaded batcher (:class:`DynamicBatcher`) and the graders' replay
  (:func:`simulate`), so the judge grades the code that served the notebook's load test; and
  because the judge only sends it lists of numbers and reads back one int, it can call it in
  the student's sandboxed worker thousands of times with nothing but data crossing.
- :func:`simulate` is a discrete-event simulation of one server replaying a trace under a
  policy, with service times from a curve: per-request latencies, throughput, time-averaged
  queue length. It is written by hand: no library simulates a batching queue whose service
  time depends on the batch size a policy chooses (``heapq``-style event queues would only add
  indirection to a single-server loop whose next event is one of three times).
- :func:`littles_law` (L = λW) checks a measured or simulated queue length against the
  arrival rate and the mean wait.
- ``check_knee``, ``check_batched_predict``, ``check_batched_speed``, ``check_heavy_load`` and
  ``check_light_load`` grade the exercises. The two load checks are deterministic given the
  curve: the grader measures the curve of :func:`build_model` on the grading machine once, then
  replays the student's policy over seeded traces whose rates and latency objectives are
  multiples of that machine's batch-1 service time.
"""

from __future__ import annotations

import functools
import itertools
import math
import numbers
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ptcourse.core import lineup, measure, seeds
from ptcourse.core.smoke import pick
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import ZEN4_VM, Target

LAB = lineup.lab("11")

JUDGED = ("knee", "batched_predict", "batched_speed", "heavy_load", "light_load")
VOUCHED = {
    "test_knee_visible": "knee",
    "test_batched_visible": "batched_predict",
    "test_policy_visible": "heavy_load",
}

SCRIPT = "tools/measure/lab11_batching.py"
SYNTHETIC = (
    "simulated on t(b) = 2 ms + 0.3 ms x b (b = 1…128), trace seeds 0-4 "
    "(tests/unit/labs/test_lab11_batching.py)"
)
TARGETS: tuple[Target, ...] = (
    # Share of requests served within the objective (10 x t(1) heavy, 4 x t(1) light) when the
    # graders replay the policy on this machine's curve: 0.95 is "p95 within the objective",
    # lowered to the reference policy's share on the same curve and trace minus 2 points.
    Target("11", "heavy_load", "cpu", "score", 0.95, 0.5,
           f"{SCRIPT} --runs 5 on this machine's curves (interleaved; t(1) 1.3-1.5 ms, batching "
           "gain 9.8-11.0x, knee 128): reference policy 0.992-1.0, median 1.0 (full); 0.999-1.0 "
           "(smoke; t(1) 1.16-1.82 ms, gain 9.2-11.6x): graded against the reference's share on "
           "the same curve and trace (full_credit_share). 40 smoke curves beside a neighbour "
           "switching between busy and idle: gain 6.6-11.0x, reference 0.941-1.0 (4 seeds each). "
           f"Synthetic: 1.0 on every seed; {SYNTHETIC}",
           "batch 1, no wait: 0.0025-0.00275 (its queue grows without bound); always a full "
           "batch: 0 (measured curves); synthetic: max_batch 4: 0.015-0.022, max_wait 8 x "
           "t(1): 0.51-0.55",
           ZEN4_VM, "2026-12-06", SCRIPT),
    Target("11", "light_load", "cpu", "score", 0.95, 0.5,
           f"{SCRIPT} --runs 5: reference policy 0.985-1.0, median 0.999 (full); 0.992-1.0 "
           "(smoke); 0.946 on a curve whose batch 2 costs 2.5 x t(1) (2026-12-04). Synthetic: "
           f"1.0 on every seed; {SYNTHETIC}",
           "always a full batch: 0.0 (the tail never served); synthetic: max_wait 3 x t(1): "
           "0.66-0.67, 8 x t(1): 0.20-0.25; batch 1: 0.997-1.0 (a light load needs no "
           "batching: the heavy row is the one it fails)",
           ZEN4_VM, "2026-12-06", SCRIPT),
    # Batched vs per-request inference of build_model, 64 requests per call, one thread,
    # graded relative to reference_batched_predict in the same run (checks.speed_check).
    Target("11", "batched_speedup", "cpu", "speedup", 5.0, 1.5,
           f"{SCRIPT} --runs 5: reference 8.3-9.2x, median 8.8x (full); 7.2-8.7x, median 8.2x "
           "(smoke); the curve's batching gain 9.8-11.0x (full), 9.2-11.6x (smoke)",
           "per-request loop pasted as the answer: 0.93-0.99x (full), 0.91-1.03x (smoke)",
           ZEN4_VM, "2026-12-06", SCRIPT),
)  # fmt: skip

Curve = dict[int, float]  # batch size -> seconds per batch
Knobs = tuple[int, float]  # (max_batch, max_wait_s)
Dispatch = Callable[[list[float], int, float], int]
"""``dispatch(ages_s, max_batch, max_wait_s) -> n``: a batching policy.

Called only when the model is free and at least one request waits. ``ages_s`` holds how long
each waiting request has waited so far, in seconds, oldest first (the oldest ``max_batch`` of
them: no batch may take more). Return how many of the oldest requests to run now as one batch,
an int from 0 to ``len(ages_s)``; 0 keeps them waiting. The policy is asked again when a
request arrives, when the model becomes free, and when the oldest waiting request has waited
``max_wait_s`` (then its age is exactly ``max_wait_s``); after a 0 at that last moment, only
the next arrival asks again.
"""


@dataclass(frozen=True)
class Sizes:
    """The served model, the curve's batch sizes and the request counts of the lab."""

    features: int  # input width of one request
    hidden: int
    classes: int
    batch_sizes: tuple[int, ...]  # the points of the batch-size curve
    curve_time_s: float  # timing budget per point of the curve
    requests: int  # requests per timed call of the batched-vs-per-request check
    heavy_requests: int  # length of the heavy-load trace the graders replay
    light_requests: int  # length of the light-load trace
    load_requests: int  # requests the notebook's real load test sends


def sizes() -> Sizes:
    """The same model in smoke and full mode (one curve serves both); smoke shortens the timing
    budget and the notebook's real load test. The replayed traces cost no real time, so the
    graders' traces keep their length in smoke mode (the same grade either way)."""
    return Sizes(
        features=512,
        hidden=2048,
        classes=8,
        batch_sizes=(1, 2, 4, 8, 16, 32, 64, 128),
        curve_time_s=pick(0.3, 0.05),
        requests=64,
        heavy_requests=4000,
        light_requests=1000,
        load_requests=pick(2000, 300),
    )


# ---------------------------------------------------------------------------------------------
# The model and its batch-size curve


def build_model(size: Sizes | None = None, seed: int = 0) -> nn.Module:
    """The served model: Linear-ReLU-Linear-ReLU-Linear, weights from ``seed``, in eval mode."""
    size = size or sizes()
    return seeds.seeded(
        lambda: nn.Sequential(
            nn.Linear(size.features, size.hidden),
            nn.ReLU(),
            nn.Linear(size.hidden, size.hidden),
            nn.ReLU(),
            nn.Linear(size.hidden, size.classes),
        ).eval(),
        seed,
    )


def requests(n: int, size: Sizes | None = None, generator: torch.Generator | None = None):
    """``n`` random requests: a list of (features,) tensors."""
    size = size or sizes()
    return list(torch.randn(n, size.features, generator=generator).unbind(0))


def measure_curve(
    batch_sizes: Sequence[int] | None = None,
    min_run_time: float | None = None,
    seed: int = 0,
    device: str = "cpu",
) -> Curve:
    """Seconds per forward pass of :func:`build_model` at each batch size (one thread, inference
    mode, warm-up excluded), cleaned by :func:`clean_curve`. A module-level function that
    returns data, so the graders can run it in the judge's trusted twin.

    The batch sizes are timed in interleaved rounds (:func:`measure.compare_many`), and t(b) is
    t(1) over the median per-round ratio t(1) / t(b): a neighbour that is busy for part of the
    run slows every batch size alike instead of bending the curve. Timed one after another, a
    busy spell during the large batches measured a 4.3x batching gain on a machine whose curve
    gains 9-13x (2026-12-06, AMD EPYC, smoke budget), a curve on which the reference policy
    served 15% of the heavy trace within its objective."""
    size = sizes()
    batch_sizes = tuple(batch_sizes or size.batch_sizes)
    min_run_time = size.curve_time_s if min_run_time is None else min_run_time
    model = build_model(size, seed).to(device)
    inputs = torch.randn(max(batch_sizes), size.features, generator=seeds.generator(seed))
    inputs = inputs.to(device)
    forward = {b: functools.partial(model, inputs[:b].contiguous()) for b in batch_sizes}
    first, *rest = batch_sizes
    with torch.inference_mode():
        if not rest:
            timing = measure.time_callable(forward[first], min_run_time=min_run_time)
            return clean_curve({first: timing.median_s})
        timed = measure.compare_many(
            forward[first],
            {str(b): forward[b] for b in rest},
            threads=1,
            budget_s=min_run_time * len(batch_sizes),
        )
    t_first = timed[str(rest[0])].baseline_s
    return clean_curve({first: t_first, **{b: t_first / timed[str(b)].ratio for b in rest}})


def clean_curve(curve: dict[Any, Any]) -> Curve:
    """``curve`` with int keys in increasing order, float seconds, and times that never fall as
    the batch grows (a larger batch cannot take less time; a noisy timing that says so is
    raised to the time of the smaller batch before it). Raises ValueError for a curve without
    batch size 1 or with a non-positive or non-finite time."""
    out: Curve = {}
    slowest = 0.0
    for b, value in sorted((int(k), v) for k, v in curve.items()):
        t = float(value)
        if not (math.isfinite(t) and t > 0):
            raise ValueError(f"batch {b}: {t!r} is not a positive time in seconds")
        slowest = max(slowest, t)
        out[b] = slowest
    if 1 not in out:
        raise ValueError("the curve needs batch size 1 (every rate is relative to it)")
    return out


def throughputs(curve: Curve) -> dict[int, float]:
    """Requests per second at each batch size: b / t(b)."""
    return {b: b / t for b, t in curve.items()}


def flops_per_request(size: Sizes | None = None) -> int:
    """Multiply-adds x 2 of one request through :func:`build_model` (biases and ReLU left out)."""
    size = size or sizes()
    macs = size.features * size.hidden + size.hidden * size.hidden + size.hidden * size.classes
    return 2 * macs


def weight_bytes(size: Sizes | None = None) -> int:
    """Bytes of fp32 weights and biases: what every forward pass reads, whatever its batch."""
    model = build_model(size)
    return sum(p.numel() * p.element_size() for p in model.parameters())


def roofline_points(curve: Curve, size: Sizes | None = None) -> dict[str, tuple[float, float]]:
    """Each batch size as a roofline point: (FLOP per byte of weights read, achieved FLOP/s).
    A batch of b reads the weights once and does b requests' work: intensity grows with b."""
    flops, bytes_ = flops_per_request(size), weight_bytes(size)
    return {f"batch {b}": (b * flops / bytes_, b * flops / t) for b, t in curve.items()}


KNEE_SHARE = 0.9  # the knee: the smallest batch reaching this share of the peak throughput


def reference_knee(curve: Curve) -> int:
    """The smallest batch size whose throughput reaches 90% of the curve's peak throughput."""
    rates = throughputs(curve)
    peak = max(rates.values())
    return min(b for b, r in rates.items() if r >= KNEE_SHARE * peak)


def service_time(curve: Curve, n: int) -> float:
    """Seconds to serve a batch of ``n``: the curve, linear between its measured batch sizes."""
    sizes_, times = zip(*sorted(curve.items()), strict=True)
    if n < 1 or n > sizes_[-1]:
        raise ValueError(f"batch {n} is outside the curve's batch sizes 1…{sizes_[-1]}")
    return float(np.interp(n, sizes_, times))


# ---------------------------------------------------------------------------------------------
# Serving requests one at a time or as a batch (the timed check)


def per_request_predict(model: nn.Module, reqs: list[Tensor]) -> list[Tensor]:
    """The baseline: one forward pass per request."""
    return [model(r.unsqueeze(0)).squeeze(0) for r in reqs]


def reference_batched_predict(model: nn.Module, reqs: list[Tensor]) -> list[Tensor]:
    """The reference: stack the requests, one forward pass, one output per request."""
    return list(model(torch.stack(reqs)).unbind(0))


# ---------------------------------------------------------------------------------------------
# Arrivals, policies, the simulated server


def poisson_trace(rate_hz: float, n: int, seed: int) -> np.ndarray:
    """Arrival times (seconds from 0, increasing) of ``n`` requests of a Poisson process of
    ``rate_hz``: exponential gaps with mean 1 / rate, drawn from ``numpy.random.default_rng``."""
    if not (rate_hz > 0 and n >= 1):
        raise ValueError("a trace needs a positive rate and at least one request")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate_hz, n)
    return np.cumsum(gaps)


def baseline_dispatch(ages_s: list[float], max_batch: int, max_wait_s: float) -> int:
    """Serve one request at a time, never wait (the baseline; its knobs: ``(1, 0.0)``)."""
    return 1


def full_batch_dispatch(ages_s: list[float], max_batch: int, max_wait_s: float) -> int:
    """Always wait for a full batch (ignores ``max_wait_s``): the policy a light load punishes."""
    return max_batch if len(ages_s) >= max_batch else 0


def reference_dispatch(ages_s: list[float], max_batch: int, max_wait_s: float) -> int:
    """Run a batch when it is full or when the oldest request has waited ``max_wait_s``."""
    if len(ages_s) >= max_batch or ages_s[0] >= max_wait_s:
        return min(len(ages_s), max_batch)
    return 0


BASELINE_KNOBS: Knobs = (1, 0.0)


def reference_knobs(curve: Curve) -> Knobs:
    """Batch up to the knee of the curve; let a request wait at most one batch-1 service time
    (at worst a lone request's latency doubles)."""
    return reference_knee(curve), curve[1]


class PolicyError(ValueError):
    """A policy returned something that is not a batch it may run, or knobs out of range."""


def _batch(n: Any, waiting: int, max_batch: int) -> int:
    if not isinstance(n, numbers.Integral) or isinstance(n, bool):
        raise PolicyError(f"the policy must return an int, got {n!r}")
    if not 0 <= int(n) <= min(waiting, max_batch):
        raise PolicyError(
            f"the policy returned {n} with {waiting} waiting and max_batch {max_batch}: "
            f"allowed 0…{min(waiting, max_batch)}"
        )
    return int(n)


NEVER = 1e300  # a stranded request's latency inside np.percentile (inf would give nan)


@dataclass(frozen=True)
class Served:
    """What happened to every request of a trace: arrival, start and end of its batch (seconds;
    ``inf`` for a request still waiting when nothing more would happen), and the queue's
    time-averaged lengths over the run."""

    arrivals: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    batches: tuple[int, ...]  # the size of every batch run, in order
    mean_waiting: float  # time-averaged number of requests waiting (not yet in a batch)
    mean_in_system: float  # waiting + in the batch being served
    busy_s: float  # time the model spent serving
    asks: int  # how many times the policy was asked

    @property
    def latencies(self) -> np.ndarray:
        return self.ends - self.arrivals

    @property
    def waits(self) -> np.ndarray:
        return self.starts - self.arrivals

    @property
    def stranded(self) -> int:
        return int(np.isinf(self.ends).sum())

    @property
    def span_s(self) -> float:
        """From the first arrival to the last completion (inf if any request was stranded)."""
        return float(self.ends.max() - self.arrivals.min())

    @property
    def throughput(self) -> float:
        """Requests served per second over the span (0 when some were never served)."""
        return 0.0 if self.stranded else len(self.arrivals) / self.span_s

    @property
    def arrival_rate(self) -> float:
        """Requests per second over the span (what Little's law pairs with the mean latency)."""
        return len(self.arrivals) / self.span_s if not self.stranded else 0.0

    @property
    def mean_batch(self) -> float:
        return float(np.mean(self.batches)) if self.batches else 0.0

    @property
    def utilisation(self) -> float:
        return self.busy_s / self.span_s if not self.stranded else 1.0

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile of latency in seconds (numpy's linear interpolation; ``inf``
        where it reaches requests that were never served)."""
        value = float(np.percentile(np.where(np.isinf(self.ends), NEVER, self.latencies), q))
        return math.inf if value >= NEVER / 2 else value

    def within(self, slo_s: float) -> float:
        """The share of requests served within ``slo_s`` seconds."""
        return float(np.mean(self.latencies <= slo_s))

    def summary(self, unit_s: float | None = None) -> str:
        """p50/p95/p99 in ms (and in multiples of ``unit_s``), throughput, mean batch."""
        parts = []
        for q in (50, 95, 99):
            value = self.percentile(q)
            text = f"p{q} {value * 1e3:.3g} ms"
            if unit_s and math.isfinite(value):
                text += f" ({value / unit_s:.3g}x t(1))"
            parts.append(text)
        served = f"{self.throughput:,.0f} req/s"
        tail = f"{self.stranded} never served" if self.stranded else served
        return (
            f"{', '.join(parts)}; {tail}; mean batch {self.mean_batch:.2f}; "
            f"mean queue {self.mean_waiting:.2f}"
        )


def simulate(
    arrivals: Sequence[float] | np.ndarray,
    dispatch: Dispatch,
    knobs: Knobs,
    curve: Curve,
    *,
    max_asks: int | None = None,
) -> Served:
    """Replay ``arrivals`` through one server under ``dispatch`` with ``knobs``; a batch of n
    takes :func:`service_time` (curve, n). Requests wait in arrival order (FIFO) and a batch
    takes the oldest. See :data:`Dispatch` for when the policy is asked. A request still
    waiting when no arrival, completion or deadline is left to ask again is stranded (its end
    is ``inf``). Raises :class:`PolicyError` for an invalid decision, or after ``max_asks``
    (default: three per request, more than the rule above can make)."""
    max_batch, max_wait_s = knobs
    arr = np.asarray(arrivals, dtype=float)
    n = len(arr)
    starts, ends = np.full(n, math.inf), np.full(n, math.inf)
    limit = 3 * n + 1 if max_asks is None else max_asks
    waiting: deque[int] = deque()
    batches: list[int] = []
    now, nxt, asks = 0.0, 0, 0
    area_waiting = area_system = busy_s = 0.0
    in_service = 0  # requests in the batch being served (counted for the system's length)
    free_at = 0.0  # when the model finishes its current batch

    def advance(to: float) -> None:
        nonlocal now, area_waiting, area_system, in_service
        area_waiting += len(waiting) * (to - now)
        area_system += (len(waiting) + (in_service if to <= free_at else 0)) * (to - now)
        now = to
        if now >= free_at:
            in_service = 0

    def arrive_until(t: float) -> None:
        nonlocal nxt
        while nxt < n and arr[nxt] <= t:
            advance(arr[nxt])
            waiting.append(nxt)
            nxt += 1
        advance(t)

    if n:
        advance(arr[0])
    deadline_asked = -1  # the request whose max-wait deadline already asked
    while True:
        if now < free_at:  # serving: arrivals queue up until the model is free
            arrive_until(free_at)
            continue
        arrive_until(now)
        if not waiting:
            if nxt >= n:
                break
            arrive_until(arr[nxt])
            continue
        oldest = waiting[0]
        ages = [now - arr[i] for i in itertools.islice(waiting, max_batch)]
        deadline = arr[oldest] + max_wait_s
        if deadline_asked == oldest:
            ages[0] = max(ages[0], max_wait_s)  # asked at the deadline: the age is exact
        asks += 1
        if asks > limit:
            raise PolicyError(f"the policy was asked more than {limit} times")
        take = _batch(dispatch(ages, max_batch, max_wait_s), len(waiting), max_batch)
        if take:
            t = service_time(curve, take)
            batch = [waiting.popleft() for _ in range(take)]
            starts[batch] = now
            ends[batch] = now + t
            batches.append(take)
            busy_s += t
            free_at, in_service = now + t, take
            continue
        # keep waiting: the next arrival, or the oldest request's deadline if still ahead
        later = [arr[nxt]] if nxt < n else []
        if deadline_asked != oldest and deadline > now:
            later.append(deadline)
        elif deadline_asked != oldest:  # the deadline is now and the policy still waits
            deadline_asked = oldest
        if not later:
            break  # nothing will ask again: the waiting requests are stranded
        t_next = min(later)
        if deadline_asked != oldest and t_next == deadline:
            deadline_asked = oldest
        arrive_until(t_next)
    span = (ends.max() - arr.min()) if n and not np.isinf(ends).any() else 0.0
    return Served(
        arrivals=arr,
        starts=starts,
        ends=ends,
        batches=tuple(batches),
        mean_waiting=area_waiting / span if span else math.inf,
        mean_in_system=area_system / span if span else math.inf,
        busy_s=busy_s,
        asks=asks,
    )


def littles_law(rate_hz: float, mean_time_s: float) -> float:
    """Little's law: the mean number in a stable system, L = λ·W (``rate_hz`` arrivals per
    second, each staying ``mean_time_s`` on average)."""
    return rate_hz * mean_time_s


# ---------------------------------------------------------------------------------------------
# The real dynamic batcher: a queue and a worker thread, driven by the same policy


@dataclass
class _Request:
    arrival: float
    x: Tensor
    future: Future = field(default_factory=Future)
    start: float = math.inf
    end: float = math.inf


class DynamicBatcher:
    """A real dynamic batcher: :meth:`submit` puts a request on a queue and returns a Future; a
    worker thread asks ``dispatch`` (see :data:`Dispatch`, with the same moments of asking as
    :func:`simulate`) when to run the oldest waiting requests as one batch through ``model``.
    ``waiting`` counts requests submitted but not yet in a batch (what a sampler reads for
    Little's law). Use it as a context manager, or call :meth:`close` (which serves or strands
    what still waits, then stops the thread)."""

    def __init__(self, model: nn.Module, dispatch: Dispatch, knobs: Knobs) -> None:
        self.model, self.dispatch = model, dispatch
        self.max_batch, self.max_wait_s = knobs
        self.done: list[_Request] = []
        self.batches: list[int] = []
        self.busy_s, self.asks = 0.0, 0
        self.waiting = 0  # submitted, not yet in a batch
        self.serving = 0  # in the batch being run
        self.error: BaseException | None = None
        self._inbox: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="batcher", daemon=True)
        self._thread.start()

    def __enter__(self) -> DynamicBatcher:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def submit(self, x: Tensor) -> Future:
        request = _Request(time.perf_counter(), x)
        with self._lock:
            self.waiting += 1
        self._inbox.put(request)
        return request.future

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join()

    def _serve(self) -> None:
        pending: deque[_Request] = deque()
        closing, deadline_asked = False, None

        def take(item: _Request | None) -> None:
            nonlocal closing
            if item is None:
                closing = True
            else:
                pending.append(item)

        try:
            while True:
                while True:  # whatever arrived meanwhile joins the queue
                    try:
                        take(self._inbox.get_nowait())
                    except queue.Empty:
                        break
                if not pending:
                    if closing:
                        return
                    take(self._inbox.get())
                    continue
                now = time.perf_counter()
                oldest = pending[0]
                ages = [now - r.arrival for r in itertools.islice(pending, self.max_batch)]
                if deadline_asked is oldest:
                    ages[0] = max(ages[0], self.max_wait_s)
                self.asks += 1
                n = _batch(self.dispatch(ages, self.max_batch, self.max_wait_s), len(ages),
                           self.max_batch)  # fmt: skip
                if n:
                    self._run([pending.popleft() for _ in range(n)])
                    continue
                deadline = oldest.arrival + self.max_wait_s
                timeout = None
                if deadline_asked is not oldest and deadline > now:
                    timeout = deadline - now
                else:
                    deadline_asked = oldest
                if closing and timeout is None:
                    self._strand(pending)
                    return
                try:
                    take(self._inbox.get(timeout=timeout))
                except queue.Empty:
                    deadline_asked = oldest
        except BaseException as error:  # noqa: BLE001 - reported on every future still open
            self.error = error
            self._strand(pending, error)
            while not closing:  # fail whatever else is submitted, until close()
                item = self._inbox.get()
                if item is None:
                    return
                item.future.set_exception(error)

    def _run(self, batch: list[_Request]) -> None:
        with self._lock:
            self.waiting -= len(batch)
            self.serving = len(batch)
        start = time.perf_counter()
        with torch.inference_mode():
            outputs = self.model(torch.stack([r.x for r in batch]))
        end = time.perf_counter()
        with self._lock:
            self.serving = 0
        self.busy_s += end - start
        self.batches.append(len(batch))
        for r, out in zip(batch, outputs.unbind(0), strict=True):
            r.start, r.end = start, end
            self.done.append(r)
            r.future.set_result(out)

    def _strand(self, pending: deque[_Request], error: BaseException | None = None) -> None:
        for r in pending:
            self.done.append(r)
            r.future.set_exception(error or RuntimeError("never dispatched: the policy kept it"))
        pending.clear()


def load_test(
    model: nn.Module,
    dispatch: Dispatch,
    knobs: Knobs,
    arrivals: Sequence[float] | np.ndarray,
    *,
    sample_s: float = 0.0005,
    seed: int = 0,
) -> Served:
    """Send one request at each time of ``arrivals`` (seconds from now) to a
    :class:`DynamicBatcher`, one torch thread, and return what happened: real latencies, and
    the queue's lengths as a sampler thread saw them every ``sample_s`` (not computed from the
    latencies: compare them with :func:`littles_law`)."""
    arr = np.asarray(arrivals, dtype=float)
    reqs = requests(len(arr), generator=seeds.generator(seed))
    samples: list[tuple[int, int]] = []
    stop = threading.Event()
    with measure.pinned_threads(1), DynamicBatcher(model, dispatch, knobs) as batcher:

        def sample() -> None:
            while not stop.wait(sample_s):
                samples.append((batcher.waiting, batcher.serving))

        sampler = threading.Thread(target=sample, name="sampler", daemon=True)
        t0 = time.perf_counter()
        sampler.start()
        futures = []
        for at, x in zip(arr, reqs, strict=True):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(batcher.submit(x))
        for f in futures:
            f.exception()  # wait; stranded requests carry an exception and an end of inf
        stop.set()
        sampler.join()
    if batcher.error is not None:
        raise batcher.error
    order = sorted(batcher.done, key=lambda r: r.arrival)
    waiting = [w for w, _ in samples] or [0]
    return Served(
        arrivals=np.array([r.arrival - t0 for r in order]),
        starts=np.array([r.start - t0 for r in order]),
        ends=np.array([r.end - t0 for r in order]),
        batches=tuple(batcher.batches),
        mean_waiting=float(np.mean(waiting)),
        mean_in_system=float(np.mean([w + s for w, s in samples] or [0])),
        busy_s=batcher.busy_s,
        asks=batcher.asks,
    )


# ---------------------------------------------------------------------------------------------
# The graders' traces: rates and objectives in multiples of this machine's batch-1 time

HEAVY_LOAD = 0.6  # the heavy trace's rate: this share of the curve's peak throughput
HEAVY_MIN_OVERLOAD = 1.25  # gradable where that rate overloads batch-1 serving by this factor
LIGHT_LOAD = 0.25  # the light trace's rate x t(1): batch-1 serving is busy a quarter of the time
HEAVY_SLO_T1 = 10.0  # latency objectives in multiples of t(1)
LIGHT_SLO_T1 = 4.0


@dataclass(frozen=True)
class Load:
    """One of the graders' traces on a given curve: its rate and its latency objective."""

    name: str
    rate_hz: float
    slo_s: float
    requests: int

    def trace(self, seed: int) -> np.ndarray:
        return poisson_trace(self.rate_hz, self.requests, seed)


def heavy_load(curve: Curve, size: Sizes | None = None) -> Load:
    """60% of the curve's peak throughput; objective: served within 10 x t(1)."""
    size, t1 = size or sizes(), curve[1]
    peak = max(throughputs(curve).values())
    return Load("heavy", HEAVY_LOAD * peak, HEAVY_SLO_T1 * t1, size.heavy_requests)


def light_load(curve: Curve, size: Sizes | None = None) -> Load:
    """A quarter of batch-1 capacity; objective: served within 4 x t(1)."""
    size, t1 = size or sizes(), curve[1]
    return Load("light", LIGHT_LOAD / t1, LIGHT_SLO_T1 * t1, size.light_requests)


def heavy_is_gradable(curve: Curve) -> bool:
    """Whether the heavy rate overloads batch-1 serving here (the curve's batching gain is at
    least 1.25 / 0.6 ≈ 2.1x); otherwise batching cannot be told from serving one at a time."""
    return heavy_load(curve).rate_hz * curve[1] >= HEAVY_MIN_OVERLOAD


# The share of requests within the objective is deterministic given the curve and the trace,
# but the curve is this machine's: on a measured curve whose batch 2 costs 2-2.6 x t(1) (one
# request takes a matrix-vector path), the reference policy served 0.915-1.0 of the heavy trace
# and 0.946-1.0 of the light one (2026-12-04, smoke curves, 3 trace seeds each). So credit is
# relative: full at the reference policy's share, replayed on the same curve and trace, minus
# this; and on a curve where the reference itself serves little, zero credit lower too.
SHARE_MARGIN = 0.02
# Where the reference serves too little for the row's floor, zero credit this far below full
# credit, but at least half of it (a policy that falls behind the trace serves almost none).
ZERO_SPREAD = 0.05


def load_goal(load_name: str, reference_share: float) -> targets.Goal:
    """The ``load_name`` row where the reference policy serves ``reference_share`` of the trace
    within the objective (:func:`checks.relative_to_reference`): full credit at that minus
    :data:`SHARE_MARGIN`, at most the row's target; zero credit at the row's floor, or where
    the reference serves too little for that, :data:`ZERO_SPREAD` below full credit but at
    least half of it."""
    goal = targets.goal(TARGETS, f"{load_name}_load")
    return checks.relative_to_reference(
        goal, reference_share, margin=SHARE_MARGIN, spread=ZERO_SPREAD
    )


def full_credit_share(load_name: str, reference_share: float) -> float:
    """The share within the objective that earns full credit (:func:`load_goal`)."""
    return load_goal(load_name, reference_share).row.target


def zero_credit_share(load_name: str, reference_share: float) -> float:
    """The share that earns nothing (:func:`load_goal`)."""
    return load_goal(load_name, reference_share).row.floor


# ---------------------------------------------------------------------------------------------
# The checks: one per hidden test cell, and the helpers only they use.


_CURVES: dict[tuple[int, ...], Curve] = {}


def grading_curve(answer: Any = None) -> Curve:
    """The batch-size curve of :func:`build_model` on this machine, measured once per process
    (in the judge: in the trusted twin of the answer's worker, as the baselines are timed)."""
    key = sizes().batch_sizes
    if key not in _CURVES:
        _CURVES[key] = checks.run_alike(answer, measure_curve, key)
    return _CURVES[key]


# Below this share for the reference policy the heavy trace grades nothing (the policy that
# keeps up best still misses the objective): graded as where batching gains too little.
MIN_REFERENCE_SHARE = 0.1


def valid_knobs(knobs: Any, curve: Curve) -> Knobs:
    """``(max_batch, max_wait_s)`` validated against ``curve``: an int from 1 to the curve's
    largest batch size, and a wait of 0 to 1 s."""
    try:
        max_batch, max_wait_s = knobs
    except (TypeError, ValueError):
        raise PolicyError(f"knobs must be a pair (max_batch, max_wait_s), got {knobs!r}") from None
    largest = max(curve)
    if not isinstance(max_batch, numbers.Integral) or isinstance(max_batch, bool):
        raise PolicyError(f"max_batch must be an int, got {max_batch!r}")
    if not 1 <= int(max_batch) <= largest:
        raise PolicyError(f"max_batch {max_batch} is outside 1…{largest} (the measured curve)")
    if not isinstance(max_wait_s, numbers.Real) or not 0.0 <= float(max_wait_s) <= 1.0:
        raise PolicyError(f"max_wait_s must be seconds from 0 to 1, got {max_wait_s!r}")
    return int(max_batch), float(max_wait_s)


def random_curve(generator: np.random.Generator, size: Sizes | None = None) -> Curve:
    """A plausible batch-size curve: a fixed cost plus a per-request cost growing like b^γ,
    with a few percent of noise, cleaned by :func:`clean_curve`. Curves whose throughput sits
    within 0.1% of the knee's threshold at some batch size are redrawn (rounding must not
    decide the knee)."""
    size = size or sizes()
    while True:
        fixed = generator.uniform(0.05e-3, 2e-3)
        per = fixed * generator.uniform(0.005, 0.5)
        gamma = generator.uniform(0.9, 1.1)
        curve = clean_curve(
            {b: (fixed + per * b**gamma) * generator.uniform(0.97, 1.03) for b in size.batch_sizes}
        )
        rates = throughputs(curve)
        bar = KNEE_SHARE * max(rates.values())
        if all(abs(r - bar) > 1e-3 * bar for r in rates.values()):
            return curve


def check_knee(knee: Callable[[Curve], int], *, points: float) -> float:
    """``knee(curve)`` names the reference's knee on fresh random curves."""
    gen = np.random.default_rng(checks.secret_seed())
    for i in range(8):
        curve = random_curve(gen)
        got, want = knee(dict(curve)), reference_knee(curve)
        if got != want:
            table = ", ".join(f"{b}: {r:,.0f}/s" for b, r in throughputs(curve).items())
            raise checks.CheckFailed(
                f"curve {i + 1}: knee {got!r}, expected {want} (the smallest batch size reaching "
                f"{KNEE_SHARE:.0%} of the peak throughput; throughputs {table})"
            )
    print(f"[lab 11 · knee] the knee of 8 fresh curves, all right: {points:g}/{points:g} points")
    return float(points)


def _same_outputs(outputs: Any, want: list[Tensor], what: str) -> None:
    if not isinstance(outputs, list | tuple) or len(outputs) != len(want):
        count = len(outputs) if isinstance(outputs, list | tuple) else type(outputs).__name__
        raise checks.CheckFailed(f"{what}: expected a list of {len(want)} outputs, got {count}")
    for i, (out, expected) in enumerate(zip(outputs, want, strict=True)):
        if isinstance(out, Tensor):
            out = out.detach()
        checks.check_close(out, expected, atol=1e-4, rtol=1e-4, what=f"{what}, request {i}")


def check_batched_predict(batched_predict: Callable[..., list[Tensor]], *, points: float) -> float:
    """One output per request, in order, equal to serving each request alone, for 1, 7 and
    ``requests`` fresh requests."""
    size, gen = sizes(), checks.secret_generator()
    model = build_model(size, seed=int(torch.randint(2**31, (1,), generator=gen)))
    for n in (1, 7, size.requests):
        reqs = requests(n, size, gen)
        with torch.inference_mode():
            want = per_request_predict(model, reqs)
        _same_outputs(batched_predict(model, reqs), want, f"{n} requests")
    print(f"[lab 11 · batched_predict] outputs equal serving each request alone: "
          f"{points:g}/{points:g} points")  # fmt: skip
    return float(points)


def check_batched_speed(batched_predict: Callable[..., list[Tensor]], *, points: float) -> float:
    """Throughput of ``batched_predict`` over the per-request loop on ``requests`` fresh requests
    per call, one thread, relative to what the reference reaches here in the same run."""
    size, gen = sizes(), checks.secret_generator()
    model = build_model(size, seed=int(torch.randint(2**31, (1,), generator=gen)))

    def fresh() -> tuple[nn.Module, list[Tensor]]:
        return model, requests(size.requests, size, gen)

    def verify(args: tuple[nn.Module, list[Tensor]], outputs: Any) -> None:
        with torch.inference_mode():
            want = per_request_predict(*args)
        _same_outputs(outputs, want, "a timed call")

    return checks.speed_check(
        targets.goal(TARGETS, "batched_speedup"),
        batched_predict,
        fresh=fresh,
        verify=verify,
        baseline=per_request_predict,
        reference=reference_batched_predict,
        inference=True,
        points=points,
    )


def replay(
    load: Load, choose_knobs: Callable[[Curve], Any], dispatch: Dispatch, curve: Curve, seed: int
) -> tuple[Knobs, Served]:
    """The student's knobs for ``curve`` and their policy replayed over ``load``'s trace."""
    try:
        knobs = valid_knobs(choose_knobs(dict(curve)), curve)
        return knobs, simulate(load.trace(seed), dispatch, knobs, curve)
    except PolicyError as error:
        raise checks.CheckFailed(f"[lab 11 · {load.name}_load] {error}") from None


def reference_served(load: Load, curve: Curve, seed: int) -> Served:
    """The reference policy replayed over ``load``'s trace on ``curve``."""
    return simulate(load.trace(seed), reference_dispatch, reference_knobs(curve), curve)


def _grade_load(
    load: Load,
    choose_knobs: Callable[[Curve], Any],
    dispatch: Dispatch,
    curve: Curve,
    seed: int,
    points: float,
) -> float:
    t1 = curve[1]
    knobs, served = replay(load, choose_knobs, dispatch, curve, seed)
    trace = load.trace(seed)
    base = simulate(trace, baseline_dispatch, BASELINE_KNOBS, curve)
    ref = reference_served(load, curve, seed)
    print(
        f"[lab 11 · {load.name}_load] {load.requests} requests at {load.rate_hz:,.0f}/s "
        f"({load.rate_hz * t1:.2f} x batch-1 capacity; t(1) = {t1 * 1e3:.3g} ms on "
        f"{measure.device_name()}); objective: served within {load.slo_s / t1:g} x t(1) = "
        f"{load.slo_s * 1e3:.3g} ms\n"
        f"  yours (max_batch {knobs[0]}, max_wait {knobs[1] * 1e3:.3g} ms): "
        f"{served.summary(t1)}; within the objective {served.within(load.slo_s):.1%}\n"
        f"  batch 1, no wait: {base.summary(t1)}; within {base.within(load.slo_s):.1%}\n"
        f"  reference {reference_knobs(curve)[0]}, {t1 * 1e3:.3g} ms: {ref.summary(t1)}; "
        f"within {ref.within(load.slo_s):.1%}"
    )
    goal = targets.goal(TARGETS, f"{load.name}_load")
    here = load_goal(load.name, ref.within(load.slo_s))
    full, zero = here.row.target, here.row.floor
    print(
        f"  full credit at {full:.1%} within the objective: the reference's share here minus "
        f"{SHARE_MARGIN:.0%}, at most {goal.row.target:.0%}; zero credit at {zero:.1%}"
    )
    return checks.value(here, lambda: served.within(load.slo_s), points=points)


def check_heavy_load(
    choose_knobs: Callable[[Curve], Any], dispatch: Dispatch, *, points: float
) -> float:
    """Replay the policy over a heavy trace (60% of the peak throughput of this machine's
    curve, more than batch-1 serving can keep up with): credit for the share of requests served
    within 10 x t(1), full at 95%. Where batching gains too little here for that trace to
    overload batch-1 serving, says so and grades that the policy forms batches under load."""
    curve = grading_curve(dispatch)
    load = heavy_load(curve)
    seed = checks.secret_seed()
    reason = None
    if not heavy_is_gradable(curve):
        gain = max(throughputs(curve).values()) * curve[1]
        reason = (
            f"batching gains {gain:.2f}x here, too little for a trace that batch-1 serving "
            f"cannot keep up with"
        )
    elif (ref := reference_served(load, curve, seed).within(load.slo_s)) < MIN_REFERENCE_SHARE:
        reason = f"on this curve the reference policy serves only {ref:.1%} within the objective"
    if reason:
        print(
            f"[lab 11 · heavy_load] not gradable on this machine: {reason}; graded instead: "
            f"your policy forms batches when requests pile up"
        )
        _, served = replay(load, choose_knobs, dispatch, curve, seed)
        if served.mean_batch < 2 or served.stranded:
            raise checks.CheckFailed(
                f"mean batch {served.mean_batch:.2f}, {served.stranded} never served"
            )
        return float(points)
    return _grade_load(load, choose_knobs, dispatch, curve, seed, points)


def check_light_load(
    choose_knobs: Callable[[Curve], Any], dispatch: Dispatch, *, points: float
) -> float:
    """Replay the policy over a light trace (a quarter of batch-1 capacity): credit for the
    share of requests served within 4 x t(1), full at 95% (a policy that waits for full batches
    leaves requests waiting for many arrivals)."""
    curve = grading_curve(dispatch)
    seed = checks.secret_seed() + 1
    return _grade_load(light_load(curve), choose_knobs, dispatch, curve, seed, points)
