"""Lab 03 (mixed precision): problem sizes per track, the fp32 baseline step, probes that see
what autocast did, the demonstrations (fp16 underflow, weight recasting, loss-scale history) and
the graders' checks.

The graders never trust the notebook: they build fresh models from secret seeds, compare a
student's step with :func:`fp32_step` run on an identical copy, and read the dtypes autocast
produced with forward hooks (:class:`Probe`). Hidden test cells reload this module
(``importlib.reload(ptcourse.labs.lab03_mixed_precision)``) after ``ptcourse.grading.checks.fresh()``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from ptcourse.assets import datasets, models, text
from ptcourse.core import hardware, measure
from ptcourse.grading import checks
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import is_smoke, pick
from ptcourse.grading.targets import CPU_VM, Target

LAB = "03"
PROBED = (nn.Linear, nn.Conv2d)  # the layers whose matmuls autocast runs in low precision
NUM_CLASSES = 4
GRAD_TOLERANCE = 0.05  # relative (norm) error allowed between a low-precision and an fp32 step


# ---------------------------------------------------------------------------------------------
# Problem sizes per track


@dataclass(frozen=True)
class TextSize:
    d_model: int
    layers: int
    heads: int
    seq_len: int
    batch: int

    def __str__(self) -> str:
        return (
            f"text classifier d_model={self.d_model}, {self.layers} layer(s), {self.heads} heads, "
            f"{self.seq_len} tokens, batch {self.batch}"
        )


@dataclass(frozen=True)
class ImageSize:
    arch: str  # "resnet18" (models.image_classifier) or "tiny_cnn"
    resolution: int
    batch: int

    def __str__(self) -> str:
        return f"{self.arch} at {self.resolution}x{self.resolution}, batch {self.batch}"


@dataclass(frozen=True)
class Sizes:
    """What the notebook measures and the graders use on one track."""

    track: str
    text: TextSize  # the timed text training step
    image: ImageSize  # the timed image training step
    train: TextSize  # the short training run of the accuracy check
    train_steps: int
    lr: float = 3e-3

    def summary(self) -> str:
        return (
            f"track {self.track}{' (smoke)' if is_smoke() else ''}\n"
            f"  timed text step : {self.text}\n"
            f"  timed image step: {self.image}\n"
            f"  accuracy run    : {self.train}, {self.train_steps} AdamW steps, lr {self.lr:g}"
        )


def sizes(track: str) -> Sizes:
    """Sizes for ``track`` ("cuda", "cpu" or "cpu-basic") in the current (smoke or full) mode.

    On "cpu" and "cuda" the timed steps keep realistic sizes even in smoke mode: a tiny model is
    dominated by per-op overhead and would show no bf16 speedup. On "cpu-basic" bf16 is emulated
    and slow, so everything is small there (only correctness is graded).
    """
    train = TextSize(pick(64, 32), 1, 2, pick(24, 16), 32)
    steps = pick(120, 40)
    if track == "cuda":
        return Sizes(
            track, TextSize(512, 4, 8, 64, 128), ImageSize("resnet18", 224, 64), train, steps
        )
    if track == "cpu":
        return Sizes(
            track, TextSize(128, 2, 4, 32, 64), ImageSize("resnet18", 128, 16), train, steps
        )
    return Sizes(
        track,
        TextSize(pick(64, 32), 1, 2, pick(24, 16), 32),
        pick(ImageSize("tiny_cnn", 64, 8), ImageSize("tiny_cnn", 32, 4)),
        train,
        steps,
    )


def track() -> hardware.Track:
    return hardware.track_for(LAB)


def _one_thread(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run ``fn`` with one torch thread: on a shared 2-core machine two threads stall badly."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with measure.pinned_threads(1):
            return fn(*args, **kwargs)

    return wrapper


# ---------------------------------------------------------------------------------------------
# Data and models


@dataclass(frozen=True)
class TextProblem:
    """The headlines, tokenised: train and test tensors of token ids and labels."""

    x_train: Tensor
    y_train: Tensor
    x_test: Tensor
    y_test: Tensor
    vocab_size: int
    seq_len: int

    def model(self, size: TextSize, seed: int, device: str = "cpu") -> models.TextClassifier:
        """A fresh TextClassifier (dropout off, so steps are deterministic) from ``seed``."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = models.TextClassifier(
                self.vocab_size, NUM_CLASSES, d_model=size.d_model, heads=size.heads,
                layers=size.layers, max_len=self.seq_len, dropout=0.0,
            )  # fmt: skip
        return model.to(device)

    def batch(
        self, size: TextSize, generator: torch.Generator, device: str = "cpu"
    ) -> tuple[Tensor, Tensor]:
        idx = torch.randint(0, len(self.x_train), (size.batch,), generator=generator)
        return self.x_train[idx].to(device), self.y_train[idx].to(device)


@functools.cache
def _text_problem(seq_len: int, smoke: bool) -> TextProblem:
    (train_texts, train_labels), (test_texts, test_labels) = datasets.headline_splits(smoke)
    vocab = text.Vocab.build(train_texts, max_size=2000 if smoke else 5000)
    return TextProblem(
        text.encode_batch(train_texts, vocab, seq_len),
        torch.tensor(train_labels),
        text.encode_batch(test_texts, vocab, seq_len),
        torch.tensor(test_labels),
        len(vocab),
        seq_len,
    )


def text_problem(seq_len: int, smoke: bool | None = None) -> TextProblem:
    """The headlines problem at ``seq_len`` tokens (smoke-size dataset in smoke mode)."""
    return _text_problem(seq_len, is_smoke() if smoke is None else smoke)


def image_model(size: ImageSize, seed: int, device: str = "cpu") -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if size.arch == "tiny_cnn":
            model = models.tiny_cnn(NUM_CLASSES)
        else:
            model = models.image_classifier(NUM_CLASSES, width=size.arch)
    return model.to(device)


def image_batch(
    size: ImageSize, generator: torch.Generator, device: str = "cpu"
) -> tuple[Tensor, Tensor]:
    """Random normalised images and labels: pixel values do not change the time of a step."""
    x = torch.randn(size.batch, 3, size.resolution, size.resolution, generator=generator)
    y = torch.randint(0, NUM_CLASSES, (size.batch,), generator=generator)
    return x.to(device), y.to(device)


def fp32_step(model: nn.Module, optimizer: torch.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    """The baseline: one plain fp32 training step; returns the loss."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


# ---------------------------------------------------------------------------------------------
# Seeing what autocast does


class Probe:
    """While active, records the dtype of every Linear/Conv2d output of ``model``."""

    def __init__(self, model: nn.Module, types: tuple[type[nn.Module], ...] = PROBED) -> None:
        self.modules = [m for m in model.modules() if isinstance(m, types)]
        self.dtypes: list[torch.dtype] = []
        self._handles: list[Any] = []

    def _hook(self, _module: nn.Module, _inputs: Any, output: Any) -> None:
        if isinstance(output, Tensor):
            self.dtypes.append(output.dtype)

    def __enter__(self) -> Probe:
        self._handles = [m.register_forward_hook(self._hook) for m in self.modules]
        return self

    def __exit__(self, *exc: object) -> None:
        for handle in self._handles:
            handle.remove()

    def fraction(self, dtype: torch.dtype) -> float:
        """Share of the recorded outputs in ``dtype`` (0 if nothing ran)."""
        if not self.dtypes:
            return 0.0
        return sum(d == dtype for d in self.dtypes) / len(self.dtypes)

    def summary(self) -> str:
        counts: dict[str, int] = {}
        for d in self.dtypes:
            counts[str(d).removeprefix("torch.")] = counts.get(str(d).removeprefix("torch."), 0) + 1
        parts = ", ".join(f"{n} × {name}" for name, n in counts.items()) or "nothing ran"
        return f"{len(self.modules)} Linear/Conv layers; outputs seen: {parts}"


def dtype_table(model: nn.Module, x: Tensor, dtype: torch.dtype = torch.bfloat16) -> list[tuple]:
    """(module type, output dtype, weight dtype) for each leaf module, forward under autocast."""
    rows: list[tuple] = []
    seen: set[str] = set()

    def hook(module: nn.Module, _inputs: Any, output: Any) -> None:
        name = type(module).__name__
        if name in seen or not isinstance(output, Tensor):
            return
        seen.add(name)
        weight = getattr(module, "weight", None)
        rows.append((name, output.dtype, weight.dtype if isinstance(weight, Tensor) else None))

    leaves = [m for m in model.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        with torch.no_grad(), torch.autocast(x.device.type, dtype=dtype):
            logits = model(x)
            loss = F.cross_entropy(logits, torch.zeros(len(x), dtype=torch.long, device=x.device))
    finally:
        for handle in handles:
            handle.remove()
    rows.append(("cross_entropy (loss)", loss.dtype, None))
    return rows


@dataclass
class CastCount:
    """Dtype-changing copies (``aten._to_copy``) seen while a block ran."""

    casts: list[tuple[tuple[int, ...], torch.dtype, torch.dtype, int]] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.casts)

    @property
    def megabytes(self) -> float:
        """Bytes read + written by the casts, in MB."""
        return sum(n for *_, n in self.casts) / 1e6

    def summary(self) -> str:
        return f"{self.count} casts moving {self.megabytes:.1f} MB"


class _CastCounter(TorchDispatchMode):
    def __init__(self, record: CastCount) -> None:
        super().__init__()
        self.record = record

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and isinstance(out, Tensor):
            src = args[0]
            if out.dtype != src.dtype:
                moved = src.numel() * (src.element_size() + out.element_size())
                self.record.casts.append((tuple(src.shape), src.dtype, out.dtype, moved))
        return out


def count_casts(fn: Callable[[], Any]) -> CastCount:
    """Run ``fn()`` once and count the dtype casts autocast (or anything else) made."""
    record = CastCount()
    with _CastCounter(record):
        fn()
    return record


# ---------------------------------------------------------------------------------------------
# Demonstrations


def weight_heavy_mlp(d: int = 1024, hidden: int = 4096, seed: int = 0) -> nn.Sequential:
    """Linear d→hidden→hidden→d with ReLUs, eval mode: almost all of its bytes are weights."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = nn.Sequential(
            nn.Linear(d, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, d),
        )  # fmt: skip
    return model.eval()


def _grad_vector(model: nn.Module) -> Tensor:
    return torch.cat([p.grad.detach().float().flatten() for p in model.parameters()])


def _text_grads(
    model: nn.Module, x: Tensor, y: Tensor, weight: float, dtype: torch.dtype | None, scale: float
) -> Tensor:
    model.zero_grad(set_to_none=False)
    with torch.autocast(x.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        loss = weight * F.cross_entropy(model(x), y)
    (loss * scale).backward()
    return _grad_vector(model) / scale


@dataclass(frozen=True)
class UnderflowRow:
    loss_weight: float
    precision: str
    scale: float
    lost: float  # share of the gradient entries that are non-zero in fp32 but exactly 0 here
    error: float  # relative (norm) error of the whole gradient vs fp32


@_one_thread
def underflow_rows(
    weights: tuple[float, ...] = (1.0, 1e-2, 1e-3, 1e-4), scale: float = 2.0**16, seed: int = 0
) -> list[UnderflowRow]:
    """Gradients of a small text classifier whose loss is weighted by ``w`` (an auxiliary loss, or
    a late stage of training): fp16 autocast without and with loss scaling, bf16 without."""
    size = TextSize(32, 1, 2, 16, 64)
    problem = text_problem(size.seq_len)
    model = problem.model(size, seed)
    x, y = problem.batch(size, torch.Generator().manual_seed(seed))
    rows = []
    for w in weights:
        ref = _text_grads(model, x, y, w, None, 1.0)
        nonzero = ref != 0
        for name, dtype, s in (
            ("fp16", torch.float16, 1.0),
            ("fp16 + scale", torch.float16, scale),
            ("bf16", torch.bfloat16, 1.0),
        ):
            g = _text_grads(model, x, y, w, dtype, s)
            lost = ((g == 0) & nonzero).sum().item() / max(nonzero.sum().item(), 1)
            error = ((g - ref).norm() / ref.norm()).item()
            rows.append(UnderflowRow(w, name, s, lost, error))
    return rows


@dataclass(frozen=True)
class ScaleHistory:
    scales: list[float]  # the scale in effect at each step
    skipped: list[bool]  # the optimizer step was skipped (inf/NaN gradients)
    losses: list[float]


@_one_thread
def scale_history(
    step: Callable[..., Any],
    steps: int,
    init_scale: float,
    growth_interval: int,
    seed: int = 0,
    device: str = "cpu",
) -> ScaleHistory:
    """Train a small text classifier with ``step(model, opt, scaler, x, y)`` and record the scale.

    A step was skipped exactly when the scaler backed off (its scale went down).
    """
    size = TextSize(32, 1, 2, 16, 32)
    problem = text_problem(size.seq_len)
    model = problem.model(size, seed, device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler(
        device, init_scale=init_scale, growth_interval=growth_interval
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    history = ScaleHistory([], [], [])
    for _ in range(steps):
        before = scaler.get_scale()
        loss = step(model, opt, scaler, *problem.batch(size, gen, device))
        history.scales.append(before)
        history.skipped.append(scaler.get_scale() < before)
        history.losses.append(float(loss))
    return history


# ---------------------------------------------------------------------------------------------
# Checks


@dataclass
class Report:
    """Properties of a student's step, each passed or not, and the low-precision share."""

    what: str
    low_precision: torch.dtype
    lowp_fraction: float = 0.0
    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)

    def add(self, name: str, passed: bool, detail: str) -> None:
        self.checks[name] = (bool(passed), detail)

    @property
    def score(self) -> float:
        """Share of low-precision layer outputs × share of properties that hold.

        A step that never runs in low precision scores 0, however correct it is otherwise.
        """
        if not self.checks:
            return 0.0
        held = sum(ok for ok, _ in self.checks.values()) / len(self.checks)
        return self.lowp_fraction * held

    def summary(self) -> str:
        name = str(self.low_precision).removeprefix("torch.")
        lines = [
            f"{self.what}: {self.lowp_fraction:.0%} of Linear/Conv outputs were {name} "
            f"under autocast"
        ]
        for check, (ok, detail) in self.checks.items():
            lines.append(f"  {'✓' if ok else '✗'} {check}: {detail}")
        return "\n".join(lines)


def _rel(a: Tensor, b: Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def _max_grad_error(model: nn.Module, ref: nn.Module) -> tuple[float, str]:
    worst, where = 0.0, ""
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if q.grad is None:
            continue
        if p.grad is None:
            return math.inf, f"{name} has no gradient"
        err = _rel(p.grad, q.grad)
        if not err <= worst:  # NaN counts as worst
            worst, where = err, name
    return worst, where


def _call(step: Callable[..., Any], *args: Any) -> Any:
    """Run the student's step with its stderr kept out of the test cell."""
    with captured_stderr():
        return step(*args)


@_one_thread
def amp_step_report(
    step: Callable[..., Any],
    seed: int,
    dtype: torch.dtype = torch.bfloat16,
    device: str | None = None,
    steps: int = 2,
) -> Report:
    """Run ``step(model, opt, x, y)`` ``steps`` times next to :func:`fp32_step` on an identical
    model (plain SGD, so an update is lr × gradient) and compare."""
    device = device or track().device
    size = sizes(track().name).train
    problem = text_problem(size.seq_len)
    model, ref = problem.model(size, seed, device), problem.model(size, seed, device)
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(seed + 1)
    report = Report("your step", dtype)
    probe = Probe(model)
    grad_err, loss_err, where, finite = 0.0, 0.0, "", True
    for _ in range(steps):
        x, y = problem.batch(size, gen, device)
        with probe:
            loss = _call(step, model, opt, x, y)
        ref_loss = fp32_step(ref, ref_opt, x, y)
        try:
            value = float(loss)
        except (TypeError, ValueError, RuntimeError):
            value = math.nan
        finite = finite and math.isfinite(value)
        loss_err = max(loss_err, abs(value - ref_loss.item()) / abs(ref_loss.item()))
        err, name = _max_grad_error(model, ref)
        if not err <= grad_err:
            grad_err, where = err, name
    report.lowp_fraction = probe.fraction(dtype)
    report.add("returns a finite loss close to fp32's", finite and loss_err <= GRAD_TOLERANCE,
               f"largest relative difference {loss_err:.2g}")  # fmt: skip
    params = list(model.parameters())
    weight_dtypes = {str(p.dtype).removeprefix("torch.") for p in params}
    report.add("master weights stay fp32", weight_dtypes == {"float32"},
               f"parameter dtypes {sorted(weight_dtypes)}")  # fmt: skip
    grad_dtypes = {str(p.grad.dtype).removeprefix("torch.") for p in params if p.grad is not None}
    report.add("gradients are fp32", grad_dtypes == {"float32"},
               f"gradient dtypes {sorted(grad_dtypes) or 'none'}")  # fmt: skip
    within = f"gradients within {GRAD_TOLERANCE:.0%} of the fp32 step's"
    detail = f"worst relative error {grad_err:.2g}" + (f" ({where})" if where else "")
    report.add(within, grad_err <= GRAD_TOLERANCE, detail)
    moved = [p.detach() - s for p, s in zip(params, start, strict=True)]
    ref_moved = [q.detach() - s for q, s in zip(ref.parameters(), start, strict=True)]
    update_err = max(
        _rel(a.to(b.dtype), b) for a, b in zip(moved, ref_moved, strict=True) if b.any()
    )
    report.add("optimizer steps match fp32's", update_err <= GRAD_TOLERANCE,
               f"worst relative difference of the weight updates {update_err:.2g}")  # fmt: skip
    return report


@_one_thread
def scaled_step_report(step: Callable[..., Any], seed: int, device: str | None = None) -> Report:
    """Check ``step(model, opt, scaler, x, y)``: fp16 under autocast, gradients unscaled before
    the optimizer step, an overflowing step skipped and the scale backed off."""
    device = device or track().device
    size = sizes(track().name).train
    problem = text_problem(size.seq_len)
    gen = torch.Generator().manual_seed(seed + 1)
    x, y = problem.batch(size, gen, device)
    report = Report("your scaled step", torch.float16)

    # An ordinary step: scale 2**16 keeps these gradients finite.
    model, ref = problem.model(size, seed, device), problem.model(size, seed, device)
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    scaler = torch.amp.GradScaler(device, init_scale=2.0**16)
    with Probe(model) as probe:
        _call(step, model, opt, scaler, x, y)
    fp32_step(ref, torch.optim.SGD(ref.parameters(), lr=0.5), x, y)
    report.lowp_fraction = probe.fraction(torch.float16)
    err, where = _max_grad_error(model, ref)
    report.add("gradients are unscaled (close to fp32's) after the step", err <= GRAD_TOLERANCE,
               f"worst relative error {err:.2g}" + (f" ({where})" if where else ""))  # fmt: skip
    update_err = max(
        _rel((p.detach() - s).float(), q.detach() - s)
        for p, q, s in zip(model.parameters(), ref.parameters(), start, strict=True)
        if not torch.equal(q.detach(), s)
    )
    report.add("the optimizer step matches fp32's", update_err <= GRAD_TOLERANCE,
               f"worst relative difference of the weight updates {update_err:.2g}")  # fmt: skip

    # A step whose scaled gradients overflow fp16: it must be skipped and the scale halved.
    model = problem.model(size, seed, device)
    start = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    huge = 2.0**32
    scaler = torch.amp.GradScaler(device, init_scale=huge)
    _call(step, model, opt, scaler, x, y)
    unchanged = all(
        torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start, strict=True)
    )
    report.add("an overflowing step is skipped (scaler.step)", unchanged,
               "weights unchanged" if unchanged else "weights changed, but at scale 2**32 the "
               "scaled gradients overflow fp16 and scaler.step must skip the step")  # fmt: skip
    scale = scaler.get_scale()
    report.add("the scale backs off after an overflow (scaler.update)", scale == huge / 2,
               f"scale {huge:g} → {scale:g} (expected {huge / 2:g})")  # fmt: skip
    return report


def grade_report(check: str, report: Report, points: float) -> float:
    """Print the report and grade its score (a "score" row: zero credit at half the properties)."""
    print(report.summary())
    return checks.check_value(LAB, check, lambda: report.score, points=points)


def timed_models(
    which: str, seed: int, device: str | None = None
) -> tuple[nn.Module, nn.Module, Tensor, Tensor]:
    """Two identical models (fp32 baseline, candidate) and one batch for the timed step."""
    device = device or track().device
    s = sizes(track().name)
    gen = torch.Generator().manual_seed(seed + 1)
    if which == "text":
        problem = text_problem(s.text.seq_len)
        x, y = problem.batch(s.text, gen, device)
        return problem.model(s.text, seed, device), problem.model(s.text, seed, device), x, y
    x, y = image_batch(s.image, gen, device)
    return image_model(s.image, seed, device), image_model(s.image, seed, device), x, y


@_one_thread
def grade_speed(which: str, step: Callable[..., Any], points: float, seed: int) -> float:
    """The timed-step check of ``which`` ("text" or "image").

    On "cpu" and "cuda": the step must run in bf16 under autocast, then its speedup over
    :func:`fp32_step` is graded. On "cpu-basic" bf16 is slow, so the same points grade that
    autocast is in effect (every Linear/Conv output bf16, finite loss, weights updated)
    at the same sizes.
    """
    here = track()
    base_model, model, x, y = timed_models(which, seed, here.device)
    base_opt = torch.optim.AdamW(base_model.parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start = [p.detach().clone() for p in model.parameters()]
    with Probe(model) as probe:
        loss = _call(step, model, opt, x, y)
    try:
        finite = math.isfinite(float(loss))
    except (TypeError, ValueError, RuntimeError):
        finite = False
    stepped = any(
        not torch.equal(p.detach(), s) for p, s in zip(model.parameters(), start, strict=False)
    )
    fraction = probe.fraction(torch.bfloat16) if finite and stepped else 0.0
    print(
        f"{which} step: {probe.summary()}; loss {'finite' if finite else 'NOT finite'}; "
        f"{'weights updated' if stepped else 'weights NOT updated'}"
    )
    if here.name == "cpu-basic":
        print(
            "This CPU has no AMX/avx512_bf16: bf16 is emulated and slower than fp32, so speed is "
            "not graded here; these points grade that autocast is in effect instead."
        )
        return checks.check_value(LAB, f"{which}_autocast", lambda: fraction, points=points)
    if fraction < 1.0:
        raise checks.CheckFailed(
            f"{which} step: not a bf16 mixed-precision training step (see the line above): run "
            "the forward pass under torch.autocast(..., dtype=torch.bfloat16), then backward and "
            "optimizer.step()"
        )
    return checks.check_speedup(
        LAB,
        f"{which}_step",
        lambda: fp32_step(base_model, base_opt, x, y),
        lambda: step(model, opt, x, y),
        points=points,
    )


@dataclass(frozen=True)
class TrainRun:
    accuracy: float
    losses: list[float]
    seconds: float


@_one_thread
def train_run(step: Callable[..., Any], seed: int, device: str | None = None) -> TrainRun:
    """A short AdamW run with ``step(model, opt, x, y)``; test accuracy at the end."""
    import time

    device = device or track().device
    s = sizes(track().name)
    problem = text_problem(s.train.seq_len)
    model = problem.model(s.train, seed, device)
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    gen = torch.Generator().manual_seed(seed + 1)
    losses = []
    start = time.perf_counter()
    for _ in range(s.train_steps):
        losses.append(float(_call(step, model, opt, *problem.batch(s.train, gen, device))))
    seconds = time.perf_counter() - start
    return TrainRun(models.accuracy(model, problem.x_test, problem.y_test), losses, seconds)


def grade_accuracy(step: Callable[..., Any], points: float, seed: int) -> float:
    """Accuracy after the same short run (same initial weights, same batches): fp32 minus yours."""
    ref = train_run(fp32_step, seed)
    yours = train_run(step, seed)
    print(
        f"test accuracy after {len(ref.losses)} steps: fp32 {ref.accuracy:.3f}, "
        f"your step {yours.accuracy:.3f}"
    )
    return checks.check_value(LAB, "accuracy", lambda: ref.accuracy - yours.accuracy, points=points)


def iter_rows(rows: list[UnderflowRow]) -> Iterator[str]:
    """The underflow rows as aligned text lines."""
    yield f"{'loss weight':>11}  {'precision':<13}{'lost gradients':>15}{'gradient error':>16}"
    for r in rows:
        yield f"{r.loss_weight:>11g}  {r.precision:<13}{r.lost:>14.2%}{r.error:>16.3g}"


AMP_SAPPHIRE = (
    "a course author's measurement on a 2-core Intel Sapphire Rapids VM (AMX), 2026-12-02, "
    "with other code than this lab's — NOT re-measured with lab 03's steps"
)
AMP_CLAIM = "the claim lab 03 quotes (GPU unknown) — NOT measured on any course machine"
TARGETS: tuple[Target, ...] = (
    # Speed: only on "cpu" (AMX/avx512_bf16) and "cuda"; cpu-basic grades *_autocast instead.
    Target("03", "text_step", "cpu", "speedup", 1.5, 1.15,
           "bf16 autocast small-encoder training step 2.2–2.3x",
           "fp32 step vs itself ≈ 1.0x", AMP_SAPPHIRE, "2026-12-02"),
    Target("03", "image_step", "cpu", "speedup", 1.5, 1.15,
           "bf16 autocast ResNet-18 b32 224 px train step 2.4–2.5x (graded: 128 px b16)",
           "fp32 step vs itself ≈ 1.0x", AMP_SAPPHIRE, "2026-12-02"),
    Target("03", "text_step", "cuda", "speedup", 1.3, 1.15,
           "the quoted claim: fp16 autocast + GradScaler 2.1x on an NLP classifier",
           "fp32 step vs itself ≈ 1.0x", AMP_CLAIM, "2026-12-02"),
    Target("03", "image_step", "cuda", "speedup", 1.3, 1.15,
           "the quoted claim: 2.1x on an NLP classifier (no image measurement)",
           "fp32 step vs itself ≈ 1.0x", AMP_CLAIM, "2026-12-02"),
    # Used on cpu-basic only, where the speed cells grade that autocast is in effect instead
    # (share of bf16 layer outputs); the rows sit on "cpu" as every check's fallback row does.
    Target("03", "text_autocast", "cpu", "score", 1.0, 0.0,
           "1.0 (all Linear outputs bf16) in 12 smoke + 10 full seeds",
           "0.0 (all fp32) in 22 of 22", CPU_VM + " (cpu-basic track)", "2026-12-02"),
    Target("03", "image_autocast", "cpu", "score", 1.0, 0.0,
           "1.0 (all Conv/Linear outputs bf16) in 12 smoke + 10 full seeds",
           "0.0 (all fp32) in 22 of 22", CPU_VM + " (cpu-basic track)", "2026-12-02"),
    # Correctness and accuracy: hardware-independent, the "cpu" rows serve every track.
    Target("03", "amp_step", "cpu", "score", 1.0, 0.5,
           "1.0 in 12 smoke + 10 full seeds; gradient error ≤ 0.012 (tolerance 0.05)",
           "0.0 in 22 of 22 (no bf16 activations)", CPU_VM + " (cpu-basic track)", "2026-12-02"),
    Target("03", "scaler", "cpu", "score", 1.0, 0.5,
           "1.0 in 12 smoke + 10 full seeds (fp16 on CPU)",
           "0.0 in 22 of 22 (fp32, scaler unused)", CPU_VM + " (cpu-basic track)", "2026-12-02"),
    Target("03", "accuracy", "cpu", "accuracy_drop", 0.02, 0.10,
           "drop −0.0025…+0.0013 in 10 smoke seeds (40 steps), −0.0002…+0.0004 in 12 full (120)",
           "0.0 (fp32 against itself)", CPU_VM + " (cpu-basic track)", "2026-12-02"),
)  # fmt: skip
