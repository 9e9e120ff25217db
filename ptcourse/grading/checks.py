"""The check contract: measure, print one line, return the points, raise below the floor.

Each lab module's ``check_<id>`` functions grade through these (and reach the answer through
the four functions :mod:`ptcourse.grading.protocol` describes): :func:`speedup`,
:func:`speed_check` (against the reference solution timed in the same run, through
:func:`relative_speedup`), :func:`memory` and :func:`value` measure and hand the value to
:func:`score`, which compares it with the row's target for this machine's track (a
:class:`~ptcourse.grading.targets.Goal`), prints one clear line, and returns the points earned
as a plain float (nbgrader reads a numeric last expression as partial credit). Below the floor
it raises :class:`CheckFailed`, which nbgrader scores 0 and shows in feedback. Nothing a check
does reaches stderr: nbgrader would score the cell 0 for it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import os
import secrets
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch

from ptcourse.core import measure
from ptcourse.core.quiet import Captured, captured_stderr
from ptcourse.grading.targets import Goal, Target

RESULTS_ENV = "PTCOURSE_RESULTS"  # a JSONL file each check appends its result to (report card)
SEED_ENV = "PTCOURSE_SECRET_SEED"


class CheckFailed(AssertionError):
    """A graded check scored zero; the message says what was measured against what."""


class SubmissionGone(RuntimeError):
    """The process running the submission's code died or hung (the judge's worker): a check
    that counts the student's exceptions as wrong answers lets this one through."""


@dataclass(frozen=True)
class Result:
    lab: str
    check: str
    track: str
    device: str
    kind: str
    value: float
    ci_low: float | None
    ci_high: float | None
    target: float
    floor: float
    points: float
    max_points: float
    message: str

    @property
    def passed(self) -> bool:
        return self.points >= self.max_points


RESULTS: list[Result] = []


def secret_seed() -> int:
    """A seed the student never saw: ``PTCOURSE_SECRET_SEED`` if set, else fresh randomness."""
    value = os.environ.get(SEED_ENV)
    return int(value) if value else secrets.randbelow(2**31)


def secret_generator() -> torch.Generator:
    return torch.Generator().manual_seed(secret_seed())


def check_close(
    actual: torch.Tensor, expected: torch.Tensor, *, atol: float, rtol: float, what: str = "output"
) -> None:
    """Raise CheckFailed unless shapes, dtypes and values agree within tolerance."""
    if not isinstance(actual, torch.Tensor):
        raise CheckFailed(f"{what}: expected a tensor, got {type(actual).__name__}")
    if actual.shape != expected.shape:
        raise CheckFailed(f"{what}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    if actual.dtype != expected.dtype:
        raise CheckFailed(f"{what}: dtype {actual.dtype}, expected {expected.dtype}")
    if not torch.allclose(actual.float(), expected.float(), atol=atol, rtol=rtol):
        diff = (actual.float() - expected.float()).abs().max().item()
        raise CheckFailed(f"{what}: max abs difference {diff:.3g} exceeds atol={atol}, rtol={rtol}")


def timed(
    answer: Callable[..., Any],
    make_args: Callable[[], tuple],
    verify: Callable[[tuple, Any], None],
    *,
    inference: bool = False,
    via: Callable[..., Any] | None = None,
) -> Callable[[], Any]:
    """What a speed or memory check measures: ``answer(*make_args())``, or ``via(answer,
    *make_args())`` where the measured work drives the answer (pulls batches from it, runs a
    pipeline it built); ``via`` is then a module-level function, run where the answer lives.

    ``verify(args, output)`` raises :class:`CheckFailed` unless ``output`` is right for
    ``args``, by the check's own computation: the answer's outputs are the student's. In a
    notebook the inputs are drawn once and one call's output is verified at once. When the
    answer lives in the judge's worker (:class:`ptcourse.judge.remote.Remote`), every call
    gets fresh inputs the submission has not seen, handed over inside the judge's clock, and
    outputs drawn after each block are verified (so a memoised, skipped or deferred
    computation loses its advantage); ``inference`` runs the worker's calls under
    ``torch.inference_mode`` (the caller's own mode cannot reach another process).
    """
    remote = getattr(type(answer), "timed", None)
    if remote is not None:
        return remote(answer, make_args, verify, inference=inference, via=via)
    args = make_args()
    run = (lambda: via(answer, *args)) if via is not None else (lambda: answer(*args))
    with captured_stderr():
        output = run()
    verify(args, output)  # here, before anything is measured
    return run


def judged(answer: Any) -> bool:
    """Whether ``answer`` lives in the judge's worker (its calls are the student's process's)."""
    return getattr(type(answer), "timed", None) is not None


class Replay:
    """The verifier of a stateful training step, ``step(model, optimizer, *batch) -> loss``,
    timed on the same model and optimizer call after call: the judge replays every call, in
    order, on its own copy of both with a trusted ``step``, and each returned loss must agree
    with the replay's within ``loss_tolerance`` (relative). :meth:`weights` then compares the
    weights the timed calls left with the replay's. A step that skips work, returns a constant
    or trains something else drifts from the replay within a few calls.

    Build it from the model and optimizer the timed calls will start from (copied here), and
    pass it as ``verify`` to :func:`timed`: it ``sees_every_call``."""

    sees_every_call = True

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer | Callable[[torch.nn.Module], torch.optim.Optimizer],
        step: Callable[..., Any],
        *,
        loss_tolerance: float,
        what: str = "a timed step",
    ) -> None:
        """``optimizer``: the timed calls' own (copied with the model), or a function that
        makes the replay's for its copy of the model (where the step's optimizer lives in the
        worker)."""
        if isinstance(optimizer, torch.optim.Optimizer):
            self.model, self.optimizer = copy.deepcopy((model, optimizer))
        else:
            self.model = copy.deepcopy(model)
            self.optimizer = optimizer(self.model)
        self.start = [p.detach().clone() for p in self.model.parameters()]
        self.step, self.tolerance, self.what = step, loss_tolerance, what
        self.calls, self.worst = 0, 0.0

    def __call__(self, args: tuple, loss: Any) -> None:
        _, _, *batch = args
        want = float(self.step(self.model, self.optimizer, *batch))
        try:
            got = float(loss)
        except (TypeError, ValueError, RuntimeError):
            got = math.nan
        self.calls += 1
        off = abs(got - want) / max(abs(want), 1e-6)
        self.worst = max(self.worst, off) if math.isfinite(off) else math.inf
        if not off <= self.tolerance:
            raise CheckFailed(
                f"{self.what} returned the loss {got:.6g} at call {self.calls}, where the judge's "
                f"replay of the same batches from the same weights computed {want:.6g}: not "
                "this training step"
            )

    def weights(self, got: list[torch.Tensor], at_most: float) -> float:
        """How far the weights the timed calls left (``got``, read in the worker) are from the
        replay's, as a share of how far the replay moved them; CheckFailed above
        ``at_most``. Returns the share."""
        want = [p.detach() for p in self.model.parameters()]
        shapes = [g.shape if isinstance(g, torch.Tensor) else None for g in got]
        if shapes != [w.shape for w in want]:
            raise CheckFailed(f"{self.what}: the model's parameters changed shape")
        moved = _distance(want, self.start)
        share = _distance([g.float() for g in got], [w.float() for w in want]) / max(moved, 1e-12)
        if not share <= at_most:
            raise CheckFailed(
                f"{self.what}: after {self.calls} timed calls the weights are {share:.2f} of the "
                f"replay's movement away from the replay's weights (at most {at_most}): the "
                "calls did not all train"
            )
        return share


def _distance(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    squares = (float(((x.double() - y.double()) ** 2).sum()) for x, y in zip(a, b, strict=True))
    return math.sqrt(sum(squares))


def timed_alike(
    answer: Any,
    fn: Callable[..., Any],
    make_args: Callable[[], tuple],
    *,
    inference: bool = False,
) -> Callable[[], Any]:
    """What the grader's own code runs in a speed check (the baseline, the reference):
    ``fn(*make_args())``, timed the way ``answer`` is. In a notebook that is a plain call on
    inputs drawn once; in the judge ``fn`` (a module-level function or a picklable callable)
    runs in a trusted twin of the answer's sandboxed worker, so a ratio compares like with like.
    Arguments that carry state between calls (a model, an optimizer) are sent once and kept."""
    remote = getattr(type(answer), "timed_alike", None)
    if remote is not None:
        return remote(answer, fn, make_args, inference=inference)
    args = make_args()
    if inference:
        return lambda: _inference(fn, args)
    return lambda: fn(*args)


def run_alike(answer: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` — the grader's own measurement (a reference timing) — run the way
    ``answer`` runs: here in a notebook, in the trusted twin of the answer's worker in the judge
    (``fn`` must then be a module-level function; it returns data)."""
    remote = getattr(type(answer), "run_alike", None)
    return remote(answer, fn, *args) if remote is not None else fn(*args)


def _inference(fn: Callable[..., Any], args: tuple) -> Any:
    with torch.inference_mode():
        return fn(*args)


def beside(answer: Any, fn: Callable[..., Any], *args: Any, keep: bool = False) -> Any:
    """``fn(answer, *args)`` in the process where ``answer`` lives: here, or in the judge's
    worker (``fn`` must then be a module-level function; what it returns is what the worker
    reports, so a check uses it for diagnostics such as which kernels ran, never for time).
    With ``keep`` the result stays where it was made (a built pipeline, a cache too large to
    send back): the judge gets a reference it can pass to later calls and to :func:`timed`."""
    remote = getattr(type(answer), "beside", None)
    if remote is None:
        return fn(answer, *args)
    return remote(answer, fn, *args, keep=keep)


def _credit(value: float, goal: float, floor: float, higher_is_better: bool) -> float:
    if higher_is_better:
        span = (value - floor) / (goal - floor)
    else:
        span = (floor - value) / (floor - goal)
    return min(1.0, max(0.0, span))


def credit(goal: Goal, value: float) -> float:
    """The share of the points ``value`` would earn against ``goal`` (0 to 1); records nothing."""
    row = goal.row
    return _credit(value, row.target, row.floor, row.higher_is_better)


Run = TypeVar("Run")


def best_run(run: Callable[[int], Run], credit_of: Callable[[Run], float], *, attempts: int) -> Run:
    """``run(seed)`` on the secret seed and, while no run has earned full credit, on the seeds
    after it, ``attempts`` runs at most; the run with the most credit.

    For graded values that depend on the seed through a short training run: a correct answer's
    run misses its target on a few seeds in a hundred, and grading one run would fail it there.
    Retries also give a wrong answer whose value varies more chances: a check first fails what
    it can tell apart without the seed (Lab 05: a block whose weights never changed).
    """
    seed = secret_seed()
    runs: list[Run] = []
    for attempt in range(attempts):
        runs.append(run((seed + attempt) % 2**31))
        if credit_of(runs[-1]) >= 1:
            break
    return max(runs, key=credit_of)


def score(
    goal: Goal,
    value: float,
    *,
    points: float,
    interval: tuple[float, float] | None = None,
    detail: str = "",
    noise: Captured | None = None,
) -> float:
    """Points for ``value`` against ``goal``: print one line, record it, raise below the floor."""
    row, track = goal.row, goal.track
    target, floor = row.target, row.floor
    earned = round(_credit(value, target, floor, row.higher_is_better) * points, 3)
    ci = f" (95% CI {interval[0]:.3g}–{interval[1]:.3g})" if interval else ""
    relation = "≥" if row.higher_is_better else "≤"
    device = measure.device_name()
    message = (
        f"[lab {row.lab} · {row.check}] {row.kind} {value:.3g}{ci}; target {relation} {target:g}, "
        f"zero credit at {floor:g}; track {track.name} on {device}: {earned:g}/{points:g} points"
    )
    if detail:
        message += f"\n  {detail}"
    if noise:
        message += f"\n  stderr of the code under test (kept out of grading): {noise.summary()}"
    result = Result(
        row.lab, row.check, track.name, device, row.kind, value,
        *(interval or (None, None)), target, floor, earned, points, message,
    )  # fmt: skip
    _record(result)
    print(message)
    if earned <= 0:
        raise CheckFailed(message)
    return earned


def _record(result: Result) -> None:
    RESULTS.append(result)
    path = os.environ.get(RESULTS_ENV)
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as f:
            f.write(json.dumps(asdict(result)) + "\n")


def speedup(
    goal: Goal,
    baseline: Callable[[], Any],
    candidate: Callable[[], Any],
    *,
    points: float,
    threads: int = 1,
) -> float:
    """Time baseline and candidate interleaved; grade the median speedup against ``goal``."""
    with captured_stderr() as noise:
        result = measure.compare(baseline, candidate, target=goal.row.target, threads=threads)
    interval = (result.ci_low, result.ci_high)
    return score(
        goal, result.ratio, points=points, interval=interval, detail=result.summary(), noise=noise
    )


SMALLEST_PEAK = 2**20


def memory(
    goal: Goal, baseline: Callable[[], Any], candidate: Callable[[], Any], *, points: float
) -> float:
    """Grade how many times less peak memory the candidate needs than the baseline."""
    with captured_stderr() as noise:
        base = measure.peak_memory(baseline, device=goal.track.device)
        cand = measure.peak_memory(candidate, device=goal.track.device)
    ratio = base.peak_bytes / max(cand.peak_bytes, SMALLEST_PEAK)
    detail = f"baseline {base.summary()}; candidate {cand.summary()}"
    if cand.peak_bytes < SMALLEST_PEAK:
        detail += " (counted as 1 MB: sampled RSS cannot resolve less)"
    return score(goal, ratio, points=points, detail=detail, noise=noise)


def value(goal: Goal, measure_value: Callable[[], float], *, points: float) -> float:
    """Grade a value the grader computes itself (an accuracy, a FLOPs ratio, an error)."""
    with captured_stderr() as noise:
        measured = float(measure_value())
    return score(goal, measured, points=points, noise=noise)


# Machine-relative speed: full credit at the floor plus this share of the reference's gain above
# it (never above the row's target); a correct answer timed in the same run as the reference
# lands within a few percent of it.
REFERENCE_SHARE = 0.7
# Where the reference gains little (Lab 08's fusion: 1.22x over a 1.1x floor), 70% of its gain
# sits within the noise between two equally fast answers (the solution measured 1.14x beside the
# reference's 1.22x in the judge): full credit then starts at 90% of the reference's ratio, but
# never lower than a quarter of its gain above the floor.
NOISE_SHARE, LEAST_GAIN_SHARE = 0.9, 0.25
# Speed is gradable only where the reference's interval clears the floor by this factor: on the
# Intel AMX VM Lab 08's fusion reference measured 1.15-1.18x over a 1.1x floor and the solution
# beside it 1.10x in two runs of two; its bf16 reference 1.25x (interval from 1.21x) over a
# 1.15x floor and the solution 1.10x (partial or no credit for right answers) — gains that
# small cannot tell a right answer from a copy of the baseline (2026-12-07). Every other speed
# row's reference clears its floor by 20% or more there.
GRADABLE_MARGIN = 1.10


def gradable(row: Target, reference_low: float) -> bool:
    """Whether a reference whose interval starts at ``reference_low`` lets speed be graded."""
    return reference_low > row.floor * GRADABLE_MARGIN


def full_credit_at(target: float, floor: float, reference: float) -> float:
    """The ratio that earns full credit on a machine where the reference measured ``reference``."""
    gain = reference - floor
    within_noise = max(NOISE_SHARE * reference, floor + LEAST_GAIN_SHARE * gain)
    return min(target, floor + REFERENCE_SHARE * gain, within_noise)


def full_credit_rule(row: Target, reference: float) -> str:
    """How :func:`full_credit_at` reaches its value where the reference measured ``reference``,
    with this machine's numbers: what a student reads to check the ratio asked of them."""
    gain = reference - row.floor
    share = row.floor + REFERENCE_SHARE * gain
    noise = max(NOISE_SHARE * reference, row.floor + LEAST_GAIN_SHARE * gain)
    return (
        f"the lowest of the target {row.target:g}x, the floor {row.floor:g}x + "
        f"{REFERENCE_SHARE:.0%} of the reference's gain ({share:.3g}x), and {NOISE_SHARE:.0%} of "
        f"the reference's ratio but at least the floor + {LEAST_GAIN_SHARE:.0%} of its gain "
        f"({noise:.3g}x)"
    )


def _grade_decided(row: Target, timed: dict[str, measure.Speedup]) -> bool:
    """Whether more rounds can no longer change the grade: the reference clear of the floor, and
    the candidate's interval wholly above the full-credit ratio the top of the reference's
    interval would ask for, or wholly below the floor."""
    ref, cand = timed["reference"], timed["candidate"]
    if not gradable(row, ref.ci_low):
        return False
    hardest = full_credit_at(row.target, row.floor, ref.ci_high)
    return cand.ci_low >= hardest or cand.ci_high <= row.floor


# A timed comparison whose intervals are this wide (relative to their medians) was disturbed
# while it ran: in a clean-clone suite on the Intel AMX VM (2026-12-07) Lab 01's solution measured
# 1.59x (95% CI 1.08-3.23x) beside the reference's 3.79x and earned 0.96 of 4 points; in quiet
# runs it measures 2.8-3.1x with intervals 5-15% wide (every speed row's candidate interval was
# 5-21% wide in a grading run of all fourteen labs). Such a comparison is taken again, at most
# twice more, and the one with the narrowest intervals is graded: the most precise, not the
# most favourable.
NOISY_WIDTH, RETAKES = 0.5, 2


def _width(timed: dict[str, measure.Speedup]) -> float:
    return max((s.ci_high - s.ci_low) / s.ratio for s in timed.values())


def _least_noisy(
    take: Callable[[], dict[str, measure.Speedup]],
) -> dict[str, measure.Speedup]:
    """``take()``, taken again while its widest interval is wider than NOISY_WIDTH of its
    median (RETAKES times at most); the take with the narrowest widest interval."""
    takes = [take()]
    while _width(takes[-1]) > NOISY_WIDTH and len(takes) <= RETAKES:
        print(
            f"the timing was disturbed (an interval {_width(takes[-1]):.0%} of its median wide): "
            "timing again"
        )
        takes.append(take())
    return min(takes, key=_width)


def relative_speedup(
    goal: Goal,
    baseline: Callable[[], Any],
    reference: Callable[[], Any],
    candidate: Callable[[], Any],
    *,
    points: float,
    not_gradable: Callable[[str], float] | None = None,
    threads: int = 1,
) -> float:
    """Grade the candidate's speedup relative to what the reference solution reaches here.

    Baseline, reference and candidate are timed in one interleaved run. Where the reference's
    interval reaches the row's floor (a baseline copy can land there), speed cannot be graded on
    this machine: the check says so and returns ``not_gradable(reason)`` (what the lab grades
    instead, e.g. the technique in effect), or raises if the lab gave nothing.
    """
    row = goal.row
    with captured_stderr() as noise:
        timed = _least_noisy(
            lambda: measure.compare_many(
                baseline,
                {"reference": reference, "candidate": candidate},
                threads=threads,
                decided=functools.partial(_grade_decided, row),
            )
        )
    ref, cand = timed["reference"], timed["candidate"]
    seen = f"reference solution here {ref.ratio:.2f}x (95% CI {ref.ci_low:.2f}–{ref.ci_high:.2f}x)"
    if not gradable(row, ref.ci_low):
        reason = (
            f"[lab {row.lab} · {row.check}] speed is not gradable on this machine: the {seen} "
            f"does not clear {row.floor * GRADABLE_MARGIN:.3g}x (the floor {row.floor:g}x, where "
            f"a copy of the baseline can land, and {GRADABLE_MARGIN - 1:.0%} of noise)"
        )
        print(reason)
        if not_gradable is None:
            raise CheckFailed(reason)
        return not_gradable(reason)
    target = full_credit_at(row.target, row.floor, ref.ratio)
    here = Goal(dataclasses.replace(row, target=round(target, 3)), goal.track)
    detail = (
        f"{cand.summary()}\n  {seen}: full credit at {target:.3g}x, "
        f"{full_credit_rule(row, ref.ratio)}; the target was measured on {row.measured_on}"
    )
    interval = (cand.ci_low, cand.ci_high)
    return score(here, cand.ratio, points=points, interval=interval, detail=detail, noise=noise)


def speed_check(
    goal: Goal,
    answer: Any,
    *,
    fresh: Callable[[], tuple],
    verify: Callable[[tuple, Any], None],
    baseline: Callable[..., Any],
    reference: Callable[..., Any],
    points: float,
    baseline_inputs: Callable[[], tuple] | None = None,
    reference_inputs: Callable[[], tuple] | None = None,
    inference: bool = False,
    via: Callable[..., Any] | None = None,
    not_gradable: Callable[[str], float] | None = None,
) -> float:
    """The machine-relative speed check: ``answer``'s speedup over ``baseline``, graded relative
    to ``reference`` timed in the same run (:func:`relative_speedup`). The answer is measured by
    :func:`timed` on ``fresh`` inputs, its outputs verified; the baseline and the reference by
    :func:`timed_alike` (in the judge, in the trusted twin of the answer's worker) on
    ``baseline_inputs`` and ``reference_inputs``, ``fresh`` where not given. ``inference`` runs
    all three under ``torch.inference_mode`` (in the judge, in their workers)."""
    base_inputs = fresh if baseline_inputs is None else baseline_inputs
    ref_inputs = fresh if reference_inputs is None else reference_inputs
    # The order of preparing the three does not decide the ratios: the gaps once blamed on it
    # (a baseline copy at 1.31x, then 1.11x) were the twin's unfixed heap (judge.HEAP).
    base = timed_alike(answer, baseline, base_inputs, inference=inference)
    ref = timed_alike(answer, reference, ref_inputs, inference=inference)
    candidate = timed(answer, fresh, verify, inference=inference, via=via)
    return relative_speedup(goal, base, ref, candidate, points=points, not_gradable=not_gradable)


def relative_to_reference(goal: Goal, reference: float, *, margin: float, spread: float) -> Goal:
    """``goal`` (higher is better) where the reference solution reaches ``reference`` here: full
    credit at ``reference - margin``, at most the row's target; zero credit at the row's floor,
    or, where the reference reaches too little for that, ``spread`` below full credit but at
    least half of it."""
    row = goal.row
    if not row.higher_is_better:
        raise ValueError(f"{row.check}: a reference-relative goal needs higher-is-better values")
    full = min(row.target, reference - margin)
    zero = min(row.floor, max(full - spread, full / 2))
    return Goal(dataclasses.replace(row, target=full, floor=zero), goal.track)


def target_here(row: Target, reference: float | None = None, yours: float | None = None) -> str:
    """What the hidden check of ``row`` asks on this machine, as the line a visible test prints.

    ``reference`` is the reference solution's ratio measured in the same run, for a row graded
    by :func:`relative_speedup`; without it the row's fixed target applies. With ``yours`` (the
    answer's value from the same run) the line ends with what that value would earn.
    """
    unit = "x" if row.kind in ("speedup", "memory_ratio", "flops_ratio") else ""
    relation = "≥" if row.higher_is_better else "≤"
    head = f"[lab {row.lab} · {row.check}] the hidden check asks {row.kind} {relation} "
    if reference is not None and not gradable(row, reference):
        return (
            f"[lab {row.lab} · {row.check}] the hidden check asks no {row.kind} here: the "
            f"reference solution measured {reference:.2f}x, not clear of the floor {row.floor:g}x "
            f"by {GRADABLE_MARGIN - 1:.0%}, "
            "so speed is not gradable here and its points grade the technique instead"
        )
    if reference is None:
        goal = row.target
        line = f"{head}{goal:g}{unit} for full credit, zero credit at {row.floor:g}{unit}"
    else:
        goal = full_credit_at(row.target, row.floor, reference)
        line = (
            f"{head}{goal:.3g}{unit} for full credit on this machine (the reference solution "
            f"measured {reference:.2f}x here; full credit at {full_credit_rule(row, reference)}), "
            f"zero credit at {row.floor:g}x"
        )
    if yours is None:
        return line
    share = _credit(yours, goal, row.floor, row.higher_is_better)
    verdict = "meets it" if share >= 1 else "no credit" if share <= 0 else f"{share:.0%} of it"
    return f"{line}\n  yours here: {yours:.3g}{unit} — {verdict}"
