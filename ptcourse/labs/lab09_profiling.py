"""Lab 09, profiling: a deliberately slow text-classifier training step (the baseline), its
reference fix, the helpers graders use to profile it, and the graders' checks.

The model (:class:`BagClassifier`) averages hashed unigram and bigram embeddings of a headline
(a fastText-style bag of features) and classifies the average with a small MLP. Its hashed
feature table is large, and the slow step :func:`baseline_step` (with :func:`baseline_setup`)
hides three planted bottlenecks behind ``record_function`` labels:

1. **dense embedding gradients**: every step allocates, zero-fills and applies a gradient as
   large as the whole table, although a batch touches only a few hundred rows of it;
2. **a Python loop over samples in data preparation**: the feature hashing round-trips the
   token tensor through ``.tolist()`` and hashes one token at a time;
3. **a per-sample, float64 loss**: the logits are converted to float64 and the cross-entropy is
   computed one sample at a time.

:func:`reference_setup`/:func:`reference_step` are the reference fix (sparse gradients with plain
SGD, vectorised hashing, one float32 cross-entropy call): the same loss and the same update.
"""

from __future__ import annotations

import contextlib
import json
import math
import statistics
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from ptcourse.assets import datasets, text
from ptcourse.core import lineup, measure, numerics, seeds
from ptcourse.core.quiet import captured_stderr
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import ZEN4_VM, Target

LAB = lineup.lab("09")

# Lab 09: the slow step (baseline_step, 2^18 x 64 hashed-feature table, batch 64, in smoke mode
# too) profiled by the grader itself (check_diagnosis), and the fixed step's speedup over it
# (check_fix_speed). Measured with tools/measure/lab09_profiling.py on 2026-12-03 in three
# sessions (3, 5 and 5 runs per mode; 13 full + 13 smoke) while other jobs oversubscribed the
# machine (load average 4-15 on 2 cores; the slow step 150-850 ms instead of ~106 ms). Earlier
# the same day the same hidden-test code ran 12 full + 12 smoke times on a 2-core AMD EPYC VM
# with AVX2 and no AVX-512 (1 thread, other core loaded): quoted as "the AVX2 VM".
# Checks the judge runs outside the student's process.
# Quick-test cells whose points the judge's check of the same answer must vouch for.
VOUCHED = {
    "test_suspects_visible": "suspects",
    "test_diagnosis_visible": "diagnosis",
    "test_fix_visible": "fix_correct",
}
JUDGED = ("suspects", "diagnosis", "fix_correct", "fix_speed")
MEASURE = "tools/measure/lab09_profiling.py"
LAB09_PROFILE = "grader's diagnose(seed), 5 steps (1 wait, 1 warm-up, 3 active), 1 thread"
TARGETS: tuple[Target, ...] = (
    # Share of the five stages a blame list gets right (blame_score) against the grader's
    # profile: 4 of 5 right earns half, 3 of 5 nothing.
    Target("09", "blame_list", "cpu", "score", 1.0, 0.6,
           f"{MEASURE} --checks blame: every stage at >= 6% with its share from seed 0's profile "
           "({'backward': 0.81, 'optimizer': 0.13}): 1.0 in 12/12 runs (6 full + 6 smoke); the "
           "grader's shares over 8 secret seeds, other core loaded: backward 0.806–0.821, "
           "optimizer 0.119–0.127, loss 0.027–0.028, forward 0.016–0.024, features "
           "0.014–0.016; avx2-machine: optimizer 0.127–0.130, backward 0.806–0.811",
           "the code reader's guess, the Python loops ({'features': 0.01-0.02, 'loss': 0.03}): "
           "0.2 in 12/12 runs (only 'forward' right); a blank {}: 0.6; everything blamed: 0.4",
           f"{ZEN4_VM}; {LAB09_PROFILE}", "2026-12-05", MEASURE),
    # Share = named op's self CPU time / top op's. The reference answer is what the solution
    # cell reads from a profile of seed 0: aten::fill_, (262144, 64), "backward"; the
    # baseline-equivalent names the runner-up: aten::add_ (same shape) and "optimizer".
    Target("09", "dominant_op", "cpu", "score", 0.75, 0.3,
           f"{MEASURE}: aten::fill_ named: 1.0 in 26/26 runs (full and smoke); on the AVX2 VM "
           "24/24",
           "runner-up aten::add_ named: 0.124–0.314 over 26 runs, medians 0.18–0.25 per mode and "
           "session (above the floor twice under the heaviest load, 0.302 and 0.314: 0.011 and "
           "0.061 of 2 points); on the AVX2 VM 0.148–0.261; an op that does not run: 0",
           f"{ZEN4_VM}; {LAB09_PROFILE}", "2026-12-03", MEASURE),
    Target("09", "shape_and_stage", "cpu", "score", 1.0, 0.0,
           f"{MEASURE}: top shape (262144, 64) and stage 'backward' in 26/26 runs: 1.0",
           "runner-up's shape (the same table) and stage 'optimizer': 0.5 in 26/26 runs; "
           "unanswered: 0",
           f"{ZEN4_VM}; {LAB09_PROFILE}", "2026-12-03", MEASURE),
    # Graded relative to the machine (checks.speed_check): full credit at the floor + 70%
    # of what reference_step reaches in the same run, never above this target.
    # reference_step (sparse embedding + vectorised hashing + one fp32 loss) vs baseline_step,
    # measure.compare interleaved. Partial fixes, full size, two runs each, load average ~5:
    # sparse only 8.4-9.6x, sparse + loss 15.4-16.4x, sparse + hashing 10.6-10.7x, hashing +
    # loss 0.95-1.06x, all three 24.3-25.8x (AVX2 VM: 14.1x, 30.9x, 15.4x, 0.98x, 45x).
    Target("09", "fixed_step", "cpu", "speedup", 20.0, 3.0,
           f"{MEASURE}, reference_setup/reference_step, 26 runs: full 16.9–326x, medians 29.1, "
           "27.6 and 29.8 per session; smoke 14.5–185x, medians 33.5, 27.1 and 23.9; under the "
           "target in 3 of 26 runs (16.9x, 19.2x, 14.5x: 2.46, 2.86 and 2.04 of 3 points); in "
           "the notebook (papermill smoke) 21.8x; on the AVX2 VM 32.9–51.7x, median 45x",
           "slow step pasted as the fix: 0.54–1.17x over 26 runs (0.96–1.17x in the last 20); on "
           "the AVX2 VM 0.76–1.19x (24 runs)",
           f"{ZEN4_VM}; interleaved pairs, measure.compare", "2026-12-03", MEASURE),
)  # fmt: skip

PRIME = 1_000_003  # bigram hash: (a * PRIME + b) mod (rows - 1) + 1
LR = 0.5
Setup = Callable[[nn.Module, float], torch.optim.Optimizer]
Step = Callable[[nn.Module, torch.optim.Optimizer, Tensor, Tensor], float]


@dataclass(frozen=True)
class Sizes:
    """Problem size of the lab: hashed feature rows, embedding width, batch, tokens per text."""

    rows: int
    dim: int
    batch: int
    length: int

    @property
    def table_mb(self) -> float:
        return self.rows * self.dim * 4 / 2**20


def sizes() -> Sizes:
    """2^18 feature rows (64 MB of fp32), in smoke mode too.

    The dense gradient is allocated afresh every step, and zero-filling fresh memory pays a
    page fault per page (measured: 64 MB of fresh zeros ~10x slower than zeroing a reused
    buffer), so ``aten::fill_`` on the table's shape dominates the slow step. With a 2^16-row
    table in smoke mode the top operator flipped between ``fill_`` and ``add_`` from run to
    run (12 runs under load), which a graded diagnosis cannot rely on; at 2^18 rows ``fill_``
    was on top in every run.
    """
    return Sizes(rows=2**18, dim=64, batch=64, length=24)


class BagClassifier(nn.Module):
    """Mean of the embeddings of the non-zero feature ids, then Linear-ReLU-Linear.

    ``forward(ids)`` takes a (B, F) LongTensor of feature ids; id 0 is padding.
    """

    def __init__(self, rows: int, dim: int = 64, hidden: int = 128, num_classes: int = 4) -> None:
        super().__init__()
        self.embedding = nn.Embedding(rows, dim, padding_idx=0)
        self.hidden = nn.Linear(dim, hidden)
        self.out = nn.Linear(hidden, num_classes)

    def forward(self, ids: Tensor) -> Tensor:
        vectors = self.embedding(ids)
        keep = (ids != 0).unsqueeze(-1).to(vectors.dtype)
        pooled = (vectors * keep).sum(dim=1) / keep.sum(dim=1).clamp(min=1.0)
        return self.out(F.relu(self.hidden(pooled)))


def build_model(size: Sizes | None = None, seed: int = 0) -> BagClassifier:
    """A BagClassifier of ``size`` with weights drawn from ``seed`` (global RNG untouched)."""
    size = size or sizes()
    classes = len(datasets.HEADLINE_CLASSES)
    return seeds.seeded(lambda: BagClassifier(size.rows, size.dim, num_classes=classes), seed)


def batches(
    batch: int, length: int, generator: torch.Generator | None = None
) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless random batches of (token ids (batch, length), labels) from the headlines."""
    encoded = text.encoded_headlines(length)  # the training split, full vocabulary
    tokens, labels = encoded.x_train, encoded.y_train
    while True:
        idx = torch.randint(0, len(tokens), (batch,), generator=generator)
        yield tokens[idx], labels[idx]


def batch(size: Sizes | None = None, seed: int = 0) -> tuple[Tensor, Tensor]:
    """One batch of headlines of ``size``, chosen by ``seed``."""
    size = size or sizes()
    return next(batches(size.batch, size.length, torch.Generator().manual_seed(seed)))


# ---------------------------------------------------------------------------------------------
# Feature hashing


def hash_features_loop(tokens: Tensor, rows: int) -> Tensor:
    """The slow way: one Python hash per token. (B, L) token ids -> (B, 2L - 1) feature ids.

    Row b holds the unigram ids ``t % (rows - 1) + 1`` of its non-padding tokens, then the
    bigram ids ``(a * PRIME + b) % (rows - 1) + 1`` of consecutive non-padding tokens, then
    zeros (padding).
    """
    width = 2 * tokens.shape[1] - 1
    out = []
    for row in tokens.tolist():
        words = [t for t in row if t != 0]
        feats = [t % (rows - 1) + 1 for t in words]
        feats += [(a * PRIME + b) % (rows - 1) + 1 for a, b in zip(words, words[1:], strict=False)]
        out.append(feats + [0] * (width - len(feats)))
    return torch.tensor(out, dtype=torch.long, device=tokens.device)


def _hash_features(tokens: Tensor, rows: int) -> Tensor:
    """The same feature ids as :func:`hash_features_loop` (as a multiset per row), vectorised:
    the graders' reference fix, private (the notebook asks the student to write it).

    Padding (id 0) is only at the end of each row, as ``text.Vocab.encode`` writes it.
    """
    keep = tokens != 0
    unigrams = (tokens % (rows - 1) + 1) * keep
    pairs = keep[:, :-1] & keep[:, 1:]
    bigrams = ((tokens[:, :-1] * PRIME + tokens[:, 1:]) % (rows - 1) + 1) * pairs
    return torch.cat([unigrams, bigrams], dim=1)


# ---------------------------------------------------------------------------------------------
# The slow step and its reference fix


def baseline_setup(model: nn.Module, lr: float = LR) -> torch.optim.Optimizer:
    """The baseline's optimizer: plain SGD over dense gradients (the model is left as built)."""
    return torch.optim.SGD(model.parameters(), lr=lr)


def baseline_step(
    model: nn.Module, opt: torch.optim.Optimizer, tokens: Tensor, labels: Tensor
) -> float:
    """One training step with the three planted bottlenecks; returns the loss."""
    rows = model.embedding.num_embeddings
    with record_function("features"):
        ids = hash_features_loop(tokens, rows)
    with record_function("forward"):
        logits = model(ids).double()
    with record_function("loss"):
        losses = [F.cross_entropy(logits[i : i + 1], labels[i : i + 1]) for i in range(len(ids))]
        loss = torch.stack(losses).mean()
    with record_function("backward"):
        opt.zero_grad()
        loss.backward()
    with record_function("optimizer"):
        opt.step()
    return loss.item()


def reference_setup(model: nn.Module, lr: float = LR) -> torch.optim.Optimizer:
    """The reference fix's setup: sparse embedding gradients, still plain SGD."""
    model.embedding.sparse = True
    return torch.optim.SGD(model.parameters(), lr=lr)


def reference_step(
    model: nn.Module, opt: torch.optim.Optimizer, tokens: Tensor, labels: Tensor
) -> float:
    """The reference fix: vectorised hashing, one float32 cross-entropy; returns the loss."""
    ids = _hash_features(tokens, model.embedding.num_embeddings)
    loss = F.cross_entropy(model(ids), labels)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()


@dataclass
class Trainer:
    """A model, its optimizer and one batch: ``trainer()`` runs one step on that batch."""

    model: nn.Module
    opt: torch.optim.Optimizer
    step: Step
    tokens: Tensor
    labels: Tensor

    def __call__(self) -> float:
        return self.step(self.model, self.opt, self.tokens, self.labels)


def trainer(
    setup: Setup,
    step: Step,
    size: Sizes | None = None,
    seed: int = 0,
    lr: float = LR,
    device: str = "cpu",
) -> Trainer:
    """A fresh model from ``seed`` on ``device``, ``setup(model, lr)``, the batch of ``seed``."""
    size = size or sizes()
    model = build_model(size, seed).to(device)
    opt = setup(model, lr)
    tokens, labels = batch(size, seed)
    return Trainer(model, opt, step, tokens.to(device), labels.to(device))


# ---------------------------------------------------------------------------------------------
# Profiling


def profile_steps(
    fn: Callable[[], Any],
    *,
    wait: int = 1,
    warmup: int = 1,
    active: int = 3,
    record_shapes: bool = True,
    with_stack: bool = False,
    activities: list[ProfilerActivity] | None = None,
    trace_path: str | Path | None = None,
    threads: int | None = 1,
) -> profile:
    """Profile ``wait + warmup + active`` calls of ``fn`` under ``schedule(...)``.

    The profiler's own start/stop messages (USDT lines, on some machines a GPU probe error) go
    to stderr; they are captured here and dropped. With ``trace_path`` the active steps are
    also written as a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing).
    Runs with ``threads`` torch threads (1: on a shared machine a second thread only stalls).
    """
    activities = activities or [ProfilerActivity.CPU]

    def on_ready(prof: profile) -> None:
        if trace_path is not None:
            prof.export_chrome_trace(str(trace_path))

    with (
        captured_stderr(),
        measure.pinned_threads(threads),
        profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active),
            on_trace_ready=on_ready,
            record_shapes=record_shapes,
            with_stack=with_stack,
        ) as prof,
    ):
        for _ in range(wait + warmup + active):
            fn()
            prof.step()
    return prof


def _aten_ops(prof: profile) -> list[Any]:
    """key_averages rows of operators (aten::…), without user ranges and ProfilerStep."""
    return [e for e in prof.key_averages() if e.key.startswith("aten::")]


def top_ops(prof: profile, n: int = 5) -> list[tuple[str, float, int]]:
    """The ``n`` operators with the most self CPU time: (name, self ms per step total, calls)."""
    ops = sorted(_aten_ops(prof), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1e3, e.count) for e in ops[:n]]


def _normalise(name: str) -> str:
    name = name.strip()
    return name if name.startswith("aten::") else f"aten::{name}"


def op_share(prof: profile, name: Any) -> float:
    """Self CPU time of operator ``name`` divided by that of the operator with the most.

    1.0 means ``name`` is the top operator; 0.0 that it did not run (or is not a string).
    The "aten::" prefix may be left out.
    """
    if not isinstance(name, str) or not name.strip():
        return 0.0
    ops = {e.key: e.self_cpu_time_total for e in _aten_ops(prof)}
    top = max(ops.values(), default=0.0)
    return ops.get(_normalise(name), 0.0) / top if top > 0 else 0.0


def range_times(prof: profile, names: tuple[str, ...]) -> dict[str, float]:
    """CPU time (ms, summed over the active steps) of the ``record_function`` ranges ``names``."""
    rows = {e.key: e.cpu_time_total / 1e3 for e in prof.key_averages()}
    return {name: rows.get(name, 0.0) for name in names}


STAGES = ("features", "forward", "loss", "backward", "optimizer")


# A stage is a bottleneck to blame when it takes at least BLAME_SHARE of the step's CPU time (the
# five ranges' sum); within BLAME_BAND of that line either answer counts, since two profiles of
# the same step differ by a few points. A blamed stage's share must be within SHARE_TOLERANCE.
BLAME_SHARE, BLAME_BAND, SHARE_TOLERANCE = 0.06, 0.02, 0.1


def stage_shares(stage_ms: dict[str, float]) -> dict[str, float]:
    """Each stage's share of the step's CPU time: its range's time / the five ranges' sum."""
    total = sum(stage_ms.get(name, 0.0) for name in STAGES)
    return {name: stage_ms.get(name, 0.0) / total if total > 0 else 0.0 for name in STAGES}


def _share(value: Any) -> float | None:
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value <= 1:
        return None
    return float(value)


def blame_score(shares: dict[str, float], suspects: Any) -> float:
    """The share of the five stages a blame list gets right against a profile's ``shares``.

    ``suspects`` maps the stages one blames to the share of the step each takes. A stage is
    right when it is blamed with a share within ``SHARE_TOLERANCE`` of the profile's and takes
    at least ``BLAME_SHARE + BLAME_BAND`` of the step, or is left out and takes less than
    ``BLAME_SHARE - BLAME_BAND``; in between, leaving it out or blaming it with a right share
    both count. Anything but a dict of stage names to numbers in [0, 1] scores 0.
    """
    if type(suspects) is not dict or not all(type(k) is str for k in suspects):
        return 0.0
    blamed = {k.strip().strip('"'): _share(v) for k, v in suspects.items()}
    if any(k not in STAGES or v is None for k, v in blamed.items()):
        return 0.0
    right = 0
    for name in STAGES:
        truth = shares.get(name, 0.0)
        if name in blamed:
            close = abs(blamed[name] - truth) <= SHARE_TOLERANCE
            right += truth >= BLAME_SHARE - BLAME_BAND and close
        else:
            right += truth < BLAME_SHARE + BLAME_BAND
    return right / len(STAGES)


def blame_verdict(shares: dict[str, float], suspects: Any) -> str:
    """One line per stage: the profile's share, the blamed share, and whether that is right."""
    lines = []
    for name in STAGES:
        truth = shares.get(name, 0.0)
        got = suspects.get(name) if type(suspects) is dict else None
        one = blame_score({name: truth}, {name: got} if got is not None else {})
        must = (
            "blame"
            if truth >= BLAME_SHARE + BLAME_BAND
            else ("leave out" if truth < BLAME_SHARE - BLAME_BAND else "either")
        )
        yours = f"blamed at {got:.0%}" if isinstance(got, (int, float)) else "left out"
        lines.append(
            f"  {name:<10} profile {truth:6.1%} ({must}); yours: {yours} -> "
            f"{'right' if one == 1.0 else 'wrong'}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class Allocation:
    """One operator call of a ``profile_memory=True`` profile that allocated memory."""

    op: str
    mb: float  # self CPU memory: allocated minus freed by the call itself, MiB
    stage: str | None  # the record_function range it ran in (None: outside the five)
    callers: tuple[str, ...]  # its chain of callers, innermost first (operators, Python frames)
    stack: tuple[str, ...]  # the Python stack the profiler recorded for it (with_stack=True)

    @property
    def stack_agrees(self) -> bool:
        """Whether the recorded stack's innermost frame is among the call's real callers."""
        return bool(self.stack) and self.stack[0] in self.callers


def allocations(prof: profile, n: int = 3) -> list[Allocation]:
    """The ``n`` operator calls (aten::…) that allocated the most memory themselves, their callers
    (walked up ``cpu_parent``, which the profiler builds from the events' nesting)."""
    ops = (e for e in prof.events() if e.name.startswith("aten::"))  # not Python frames
    calls = sorted(ops, key=lambda e: e.self_cpu_memory_usage, reverse=True)
    found = []
    for e in calls[:n]:
        chain, parent = [], e.cpu_parent
        while parent is not None:
            chain.append(parent.name)
            parent = parent.cpu_parent
        stage = next((name for name in chain if name in STAGES), None)
        mb = e.self_cpu_memory_usage / 2**20
        found.append(Allocation(e.name, mb, stage, tuple(chain), tuple(e.stack or ())))
    return found


@dataclass(frozen=True)
class Span:
    """One ``record_function`` range of a trace: its wall time and how much of it ran inside
    operators (the rest is Python, or anything else outside an operator)."""

    name: str
    start_ms: float
    wall_ms: float
    in_ops_ms: float

    @property
    def outside_ops_ms(self) -> float:
        return max(0.0, self.wall_ms - self.in_ops_ms)


def trace_spans(trace_path: str | Path, names: tuple[str, ...] = STAGES) -> list[Span]:
    """The ranges ``names`` of the first profiled step in a Chrome trace, in order.

    ``in_ops_ms`` sums the top-level operators (those not nested in another operator) inside
    each range, on the range's thread.
    """
    events = [e for e in json.loads(Path(trace_path).read_text())["traceEvents"] if "dur" in e]
    steps = sorted(
        (e for e in events if str(e["name"]).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )
    if not steps:
        return []
    t0, t1 = steps[0]["ts"], steps[0]["ts"] + steps[0]["dur"]
    ranges = sorted(
        (e for e in events if e.get("cat") == "user_annotation" and e["name"] in names
         and t0 <= e["ts"] <= t1),
        key=lambda e: e["ts"],
    )  # fmt: skip
    spans = []
    for r in ranges:
        start, end = r["ts"], r["ts"] + r["dur"]
        ops = sorted(
            (e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == r.get("tid")
             and start <= e["ts"] and e["ts"] + e["dur"] <= end),
            key=lambda e: (e["ts"], -e["dur"]),
        )  # fmt: skip
        covered, reach = 0.0, start
        for op in ops:
            if op["ts"] >= reach:  # not nested in the previous top-level operator
                covered += op["dur"]
                reach = op["ts"] + op["dur"]
        spans.append(Span(r["name"], (start - t0) / 1e3, r["dur"] / 1e3, covered / 1e3))
    return spans


def time_fix(
    fixed: Trainer, *, budget_s: float, min_rounds: int, seed: int = 0
) -> dict[str, measure.Speedup]:
    """The speedups of ``fixed`` and of the graders' reference fix over the slow step, timed in
    one interleaved run (what a visible test prints ``checks.target_here`` from)."""
    slow = trainer(baseline_setup, baseline_step, seed=seed)
    ref = trainer(reference_setup, reference_step, seed=seed)
    with captured_stderr():
        return measure.compare_many(
            slow, {"reference": ref, "yours": fixed}, budget_s=budget_s, min_rounds=min_rounds
        )


# ---------------------------------------------------------------------------------------------
# Correctness of a fixed step


@dataclass(frozen=True)
class SameTraining:
    """How far a candidate's step is from the slow step on the same model and batches."""

    loss: float
    expected_loss: float
    grad_error: float  # ||g_candidate - g_slow|| / ||g_slow|| over all parameters (last step)
    update_error: float  # the same for the weight change over all steps
    embedding_sparse: bool

    @property
    def ok(self) -> bool:
        loss_ok = abs(self.loss - self.expected_loss) <= 1e-5 + 1e-4 * abs(self.expected_loss)
        return loss_ok and self.grad_error < 1e-4 and self.update_error < 1e-2

    def summary(self) -> str:
        return (
            f"loss {self.loss:.6g} vs slow step {self.expected_loss:.6g}; gradients differ by "
            f"{self.grad_error:.2g}, weight updates by {self.update_error:.2g} (relative); "
            f"sparse embedding gradient: {self.embedding_sparse}"
        )


def _dense_grads(model: nn.Module) -> list[Tensor]:
    grads = []
    for p in model.parameters():
        g = p.grad if p.grad is not None else torch.zeros_like(p)
        grads.append((g.to_dense() if g.is_sparse else g).detach().clone())
    return grads


def _sparse_gradient(weight: Tensor) -> bool:
    return weight.grad is not None and weight.grad.is_sparse


def same_training(
    setup: Setup, step: Step, seed: int, size: Sizes | None = None, steps: int = 2
) -> SameTraining:
    """Run ``steps`` steps of the slow and of the candidate training on equal fresh models and
    batches from ``seed``; compare the last loss, the last gradients and the weight updates.

    Gradients are compared directly: weight updates are tiny next to the weights, so fp32
    rounding of ``w - lr * g`` alone makes them differ by ~1e-3 between dense and sparse SGD.
    """
    size = size or sizes()
    gen = torch.Generator().manual_seed(seed)
    data_batches = [next(batches(size.batch, size.length, gen)) for _ in range(steps)]
    runs = []
    for make, fn in ((baseline_setup, baseline_step), (setup, step)):
        model = build_model(size, seed)
        before = [p.detach().clone() for p in model.parameters()]
        opt = make(model, LR)
        losses = [float(fn(model, opt, x, y)) for x, y in data_batches]
        delta = [p.detach() - b for p, b in zip(model.parameters(), before, strict=True)]
        runs.append((losses[-1], _dense_grads(model), delta, model))
    (want_loss, want_grads, want_delta, _), (loss, grads, delta, model) = runs
    return SameTraining(
        loss=loss,
        expected_loss=want_loss,
        grad_error=numerics.relative_error(grads, want_grads),
        update_error=numerics.relative_error(delta, want_delta),
        embedding_sparse=_sparse_gradient(model.embedding.weight),
    )


# ---------------------------------------------------------------------------------------------
# Dense or sparse embedding gradients: when does each win?


def embedding_update(
    rows: int, dim: int, ids: Tensor, sparse: bool, optimizer: str = "sgd"
) -> Callable[[], None]:
    """One training update of a bare (rows, dim) embedding looked up at ``ids``.

    ``optimizer``: "sgd" (dense or sparse gradients), "adam" (dense only: Adam rejects sparse
    gradients) or "sparse_adam" (torch.optim.SparseAdam, sparse only).
    """
    emb = nn.Embedding(rows, dim, sparse=sparse)
    opts: dict[str, Callable[[], torch.optim.Optimizer]] = {
        "sgd": lambda: torch.optim.SGD(emb.parameters(), lr=0.1),
        "adam": lambda: torch.optim.Adam(emb.parameters(), lr=1e-3),
        "sparse_adam": lambda: torch.optim.SparseAdam(list(emb.parameters()), lr=1e-3),
    }
    opt = opts[optimizer]()

    def update() -> None:
        opt.zero_grad()
        emb(ids).sum().backward()
        opt.step()

    return update


# ---------------------------------------------------------------------------------------------
# GPU: kernel time, copies and utilisation from a CUDA profile


@dataclass(frozen=True)
class GpuBusy:
    """Device-side time of a profiled window, from the profiler's CUDA activity."""

    kernel_ms: float
    h2d_ms: float
    d2h_ms: float
    other_copy_ms: float
    wall_ms: float

    @property
    def utilisation(self) -> float:
        """Share of the wall time the GPU was executing kernels (an upper bound: overlaps
        between streams count twice)."""
        return self.kernel_ms / self.wall_ms if self.wall_ms > 0 else 0.0

    @property
    def copy_share(self) -> float:
        busy = self.kernel_ms + self.h2d_ms + self.d2h_ms + self.other_copy_ms
        copies = self.h2d_ms + self.d2h_ms + self.other_copy_ms
        return copies / busy if busy > 0 else 0.0

    def summary(self) -> str:
        return (
            f"kernels {self.kernel_ms:.2f} ms, copies H2D {self.h2d_ms:.2f} ms, D2H "
            f"{self.d2h_ms:.2f} ms, other {self.other_copy_ms:.2f} ms in {self.wall_ms:.2f} ms "
            f"of wall time: GPU busy with kernels {self.utilisation:.0%}, copies "
            f"{self.copy_share:.0%} of device time"
        )


def step_wall_ms(prof: profile) -> float:
    """Wall time (ms) of the profiled steps: the sum of the ``ProfilerStep`` ranges."""
    return sum(
        e.time_range.elapsed_us() / 1e3
        for e in prof.events()
        if e.name.startswith("ProfilerStep") and e.device_type == torch.autograd.DeviceType.CPU
    )


def gpu_busy(prof: profile, wall_ms: float) -> GpuBusy:
    """Sum the CUDA-side events of ``prof`` (kernels, memcpy by direction) over ``wall_ms``."""
    kernel = h2d = d2h = other = 0.0
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        if getattr(event, "is_user_annotation", False):  # record_function ranges on the GPU
            continue
        ms = event.time_range.elapsed_us() / 1e3
        name = event.name.lower()
        if "memcpy" in name or "memset" in name:
            if "htod" in name:
                h2d += ms
            elif "dtoh" in name:
                d2h += ms
            else:
                other += ms
        else:
            kernel += ms
    return GpuBusy(kernel, h2d, d2h, other, wall_ms)


# ---------------------------------------------------------------------------------------------
# The checks: the graders' own profile, fresh models and batches from a secret seed.


@dataclass(frozen=True)
class Diagnosis:
    """What the grader's own profile of the slow step found."""

    self_ms: dict[str, float]  # operator -> self CPU ms over the active steps
    top_shapes: dict[str, tuple[int, ...]]  # operator -> first input shape of its costliest call
    stage_ms: dict[str, float]  # record_function range -> CPU ms

    @property
    def top_op(self) -> str:
        return max(self.self_ms, key=self.self_ms.get)

    @property
    def top_stage(self) -> str:
        return max(self.stage_ms, key=self.stage_ms.get)

    def op_share(self, name: Any) -> float:
        """Self time of operator ``name`` / that of the top operator (1.0: it is the top)."""
        if not isinstance(name, str) or not name.strip():
            return 0.0
        return self.self_ms.get(_normalise(name), 0.0) / self.self_ms[self.top_op]

    def shape_and_stage(self, shape: Any, stage: Any) -> float:
        """Half for the shape of the top operator's costliest call, half for the top stage."""
        try:
            shape_ok = tuple(int(n) for n in shape) == self.top_shapes[self.top_op]
        except (TypeError, ValueError):
            shape_ok = False
        return 0.5 * shape_ok + 0.5 * (stage == self.top_stage)

    @property
    def stage_shares(self) -> dict[str, float]:
        return stage_shares(self.stage_ms)

    def blame(self, suspects: Any) -> float:
        """The share of the five stages the blame list ``suspects`` gets right."""
        return blame_score(self.stage_shares, suspects)

    def summary(self) -> str:
        top = self.top_op
        return (
            f"grader's profile: top operator {top} ({self.self_ms[top]:.1f} ms self CPU, first "
            f"input {list(self.top_shapes[top])}), top stage {self.top_stage} "
            f"({self.stage_ms[self.top_stage]:.1f} ms)"
        )


def diagnosis(prof: profile) -> Diagnosis:
    """Summarise a profile of the slow step: operators' self time, shapes, stage times."""
    self_ms = {e.key: e.self_cpu_time_total / 1e3 for e in _aten_ops(prof)}
    costliest: dict[str, tuple[float, tuple[int, ...]]] = {}
    for e in prof.key_averages(group_by_input_shape=True):
        shape = tuple(e.input_shapes[0]) if e.input_shapes and e.input_shapes[0] else ()
        if e.key in self_ms and e.self_cpu_time_total > costliest.get(e.key, (-1.0, ()))[0]:
            costliest[e.key] = (e.self_cpu_time_total, shape)
    return Diagnosis(self_ms, {k: v[1] for k, v in costliest.items()}, range_times(prof, STAGES))


def diagnose(seed: int, size: Sizes | None = None, repeats: int = 3) -> Diagnosis:
    """The grader's profile: the slow step on a fresh model and batch from ``seed``, profiled
    ``repeats`` times; each operator's and stage's time is the median over the profiles (in the
    judge one disturbed profile of three active steps once put 'forward' at 8.5% of the step
    against 1.6-2.4% in every other: a correct blame list lost half its points)."""
    run = trainer(baseline_setup, baseline_step, size, seed)
    found = [diagnosis(profile_steps(run)) for _ in range(repeats)]

    def median(parts: list[dict[str, float]]) -> dict[str, float]:
        return {k: statistics.median(p.get(k, 0.0) for p in parts) for k in parts[0]}

    return Diagnosis(
        median([d.self_ms for d in found]), found[0].top_shapes, median([d.stage_ms for d in found])
    )


def check_suspects(suspects: Any, *, points: float) -> float:
    """The student's blame list (stage -> share of the step's CPU time) against the grader's
    own profile of the slow step on a fresh model and batch: the share of the five stages it
    gets right (:func:`blame_score`)."""
    found = diagnose(checks.secret_seed())
    print("grader's profile, stage by stage:\n" + blame_verdict(found.stage_shares, suspects))
    return checks.value(
        targets.goal(TARGETS, "blame_list"), lambda: found.blame(suspects), points=points
    )


def check_diagnosis(
    dominant_op: Any, dominant_shape: Any, dominant_stage: Any, *, points: float
) -> float:
    """The student's diagnosis against the grader's own profile of the slow step: the operator
    earns 2/3 of ``points`` (full credit at 75% of the top operator's self time), the shape and
    the stage 1/3 (half of it each). Raises CheckFailed when nothing matched."""
    found = diagnose(checks.secret_seed())
    print(found.summary())
    parts = {
        "dominant_op": (lambda: found.op_share(dominant_op), 2 / 3),
        "shape_and_stage": (lambda: found.shape_and_stage(dominant_shape, dominant_stage), 1 / 3),
    }
    earned = 0.0
    for check, (value, share) in parts.items():
        # A part below its floor prints what it measured and earns 0; the other still counts.
        with contextlib.suppress(checks.CheckFailed):
            earned += checks.value(targets.goal(TARGETS, check), value, points=share * points)
    if earned <= 0:
        raise checks.CheckFailed("no part of the diagnosis matches the grader's profile")
    return earned


def check_fix_correct(fast_setup: Setup, fast_step: Step, *, points: float) -> float:
    """The fixed step trains like the slow one (loss, gradients, updates) over three steps."""
    seed = checks.secret_seed()
    with captured_stderr():
        result = same_training(fast_setup, fast_step, seed, steps=3)
    print(result.summary())
    if not result.ok:
        raise checks.CheckFailed(f"not the slow step's training: {result.summary()}")
    return float(points)


def check_fix_speed(fast_setup: Setup, fast_step: Step, *, points: float) -> float:
    """The fixed step's speedup over the grader's own slow step, relative to what the reference
    fix reaches on this machine in the same run, after checking it still trains the same way."""
    goal = targets.goal(TARGETS, "fixed_step")
    seed = checks.secret_seed()
    with captured_stderr():
        same = same_training(fast_setup, fast_step, seed, steps=1)
        baseline = trainer(baseline_setup, baseline_step, seed=seed)
        reference = trainer(reference_setup, reference_step, seed=seed)
        fixed = trainer(fast_setup, fast_step, seed=seed)
        fixed()
    if not same.ok:
        raise checks.CheckFailed(f"the fixed step must train like the slow one: {same.summary()}")
    replay = checks.Replay(
        fixed.model, lambda model: reference_setup(model, LR), reference_step,
        loss_tolerance=REPLAY_LOSS_TOLERANCE, what="the fixed step",
    )  # fmt: skip
    earned = checks.speed_check(
        goal,
        fast_step,
        fresh=_fresh_batches(fixed, seed),
        verify=replay,
        baseline=baseline_step,
        baseline_inputs=_fresh_batches(baseline, seed),
        reference=reference_step,
        reference_inputs=_fresh_batches(reference, seed),
        points=points,
    )
    if checks.judged(fast_step):  # the weights the timed calls left, read in the worker
        share = replay.weights(checks.beside(fast_step, parameters_of, fixed.model), REPLAY_WEIGHTS)
        print(f"  the {replay.calls} timed calls trained as the judge's replay (weights "
              f"{share:.2g} of its movement apart, losses within {replay.worst:.2g})")  # fmt: skip
    return earned


# The timed calls of the fixed step against the judge's replay of the same batches with
# reference_step: the loss of every call (relative) and the weights at the end (a share of how
# far the replay moved them). Plain SGD in fp32, which a right fix does not change: the
# solution's step measured 0 and 0 in the judge at smoke size (Intel AMX VM, 2026-12-07); the
# margins leave room for a fix that sums in another order. A step that skips a tenth of its
# updates is about a tenth of the movement short.
REPLAY_LOSS_TOLERANCE, REPLAY_WEIGHTS = 1e-3, 0.02


def parameters_of(step: Step, model: nn.Module) -> list[Tensor]:
    """``model``'s parameters where ``step`` runs (the judge reads the worker's copy)."""
    return [p.detach() for p in model.parameters()]


def _fresh_batches(run: Trainer, seed: int) -> Callable[[], tuple[Any, ...]]:
    """The trainer's model and optimizer with a new batch at every call (what the judge times)."""
    size, gen = sizes(), torch.Generator().manual_seed(seed + 1)
    return lambda: (run.model, run.opt, *next(batches(size.batch, size.length, gen)))
