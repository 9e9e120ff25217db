"""Lab 04, gradient accumulation: its models, its task, the graders' reference step and an
honest way to measure peak memory on CPU.

- :func:`conv_net` is a small conv net whose activations, not its weights, take the memory
  (optionally with BatchNorm, to show where accumulation stops being exact).
- :func:`full_batch_step` is the baseline the graders compare with: one forward and backward
  over the whole batch.
- :func:`rss_follows_tensors` makes CPU peak-memory measurements (sampled RSS) repeatable by
  pinning glibc's allocation thresholds; without it, glibc's reuse of freed memory makes the
  increase a step shows depend on what ran before it.
- :func:`teacher_task` and :func:`train_sgd` give the short training runs of the LR-scaling
  experiment.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ptcourse.core import measure
from ptcourse.core.measure import release_freed_memory, rss_follows_tensors  # noqa: F401 (lab 04 API)
from ptcourse.core.smoke import pick
from ptcourse.grading.targets import CPU_VM, Target

LossFn = Callable[[Tensor, Tensor], Tensor]
Step = Callable[..., float]


def conv_net(channels: int = 16, num_classes: int = 4, batchnorm: bool = False) -> nn.Sequential:
    """Five 3x3 convs (two at full resolution) with ReLU and max-pooling, then pool + linear.

    Few weights (about 70k at 16 channels) but large activations: at 64x64 inputs one sample
    keeps a few MB alive for the backward pass, so peak memory grows with the batch size.
    ``batchnorm=True`` puts a BatchNorm2d after every conv (same convs, same init order).
    """
    c = channels

    def block(c_in: int, c_out: int) -> list[nn.Module]:
        layers: list[nn.Module] = [nn.Conv2d(c_in, c_out, 3, padding=1)]
        if batchnorm:
            layers.append(nn.BatchNorm2d(c_out))
        return [*layers, nn.ReLU()]

    return nn.Sequential(
        *block(3, c), *block(c, c), nn.MaxPool2d(2),
        *block(c, 2 * c), *block(2 * c, 2 * c), nn.MaxPool2d(2),
        *block(2 * c, 4 * c), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(4 * c, num_classes),
    )  # fmt: skip


def mlp(in_features: int = 32, hidden: int = 64, num_classes: int = 4, depth: int = 2) -> nn.Module:
    """``depth`` hidden Linear+GELU layers and a linear head. Wide ``hidden``: weight-heavy."""
    layers: list[nn.Module] = []
    width = in_features
    for _ in range(depth):
        layers += [nn.Linear(width, hidden), nn.GELU()]
        width = hidden
    return nn.Sequential(*layers, nn.Linear(width, num_classes))


def images(batch: int, size: int, num_classes: int = 4, generator: torch.Generator | None = None):
    """Random (batch, 3, size, size) inputs and labels: for gradients and memory, not learning."""
    x = torch.randn(batch, 3, size, size, generator=generator)
    y = torch.randint(0, num_classes, (batch,), generator=generator)
    return x, y


def seeded(build: Callable[[], nn.Module], seed: int) -> nn.Module:
    """``build()`` with its weights drawn from ``seed``, leaving the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


@dataclass(frozen=True)
class MemoryCheck:
    """The problem the graded memory check runs (its size is the grader's, not the notebook's)."""

    batch: int
    image: int
    channels: int
    accum_steps: int


def memory_check_sizes() -> MemoryCheck:
    """Batch 64 of 64x64 images (32x32 in smoke mode), 16 channels, 4 micro-batches."""
    return MemoryCheck(batch=64, image=pick(64, 32), channels=16, accum_steps=4)


def full_batch_step(model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor) -> float:
    """The baseline: one forward and one backward over the whole batch.

    Like ``loss.backward()`` it adds into ``.grad`` (zero the gradients first); returns the
    loss as a float.
    """
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item()


def gradients(model: nn.Module) -> list[Tensor]:
    """Copies of every parameter's ``.grad`` (zeros where a parameter has none)."""
    return [
        (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
        for p in model.parameters()
    ]


def max_abs_difference(a: list[Tensor], b: list[Tensor]) -> float:
    """Largest absolute difference between two lists of gradients."""
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a, b, strict=True))


def relative_difference(a: list[Tensor], b: list[Tensor]) -> float:
    """||a - b|| / ||b|| over all gradients together."""
    num = math.sqrt(
        sum(((x.double() - y.double()) ** 2).sum().item() for x, y in zip(a, b, strict=True))
    )
    den = math.sqrt(sum((y.double() ** 2).sum().item() for y in b))
    return num / max(den, 1e-30)


def grads_after(
    step: Step, model: nn.Module, loss_fn: LossFn, x: Tensor, y: Tensor, *args: Any, **kwargs: Any
) -> tuple[list[Tensor], float]:
    """Zero the gradients, run ``step(model, loss_fn, x, y, *args)``: (gradients, its return)."""
    model.zero_grad(set_to_none=True)
    result = step(model, loss_fn, x, y, *args, **kwargs)
    return gradients(model), result


def teacher_task(
    n: int, dim: int = 32, num_classes: int = 4, seed: int = 0, teacher_seed: int = 1234
) -> tuple[Tensor, Tensor]:
    """A learnable task: ``n`` Gaussian inputs (drawn from ``seed``) labelled by the argmax of a
    fixed random two-layer "teacher" network (from ``teacher_seed``: keep it for train and test).
    """
    g = torch.Generator().manual_seed(teacher_seed)
    w1 = torch.randn(dim, 64, generator=g) / math.sqrt(dim)
    w2 = torch.randn(64, num_classes, generator=g) / 8.0
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    y = (torch.tanh(x @ w1) @ w2).argmax(dim=1)
    return x, y


@torch.no_grad()
def evaluate(model: nn.Module, x: Tensor, y: Tensor) -> tuple[float, float]:
    """(mean cross-entropy, accuracy) of ``model`` on (x, y)."""
    logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def train_sgd(
    model: nn.Module,
    step: Step,
    x: Tensor,
    y: Tensor,
    *,
    batch: int,
    accum_steps: int,
    lr: float,
    samples: int,
    test: tuple[Tensor, Tensor],
    points: int = 16,
    seed: int = 0,
) -> dict[str, list[float]]:
    """Plain SGD for ``samples`` training samples; each optimizer step sees ``batch`` samples
    through ``step(model, F.cross_entropy, xb, yb, accum_steps)``.

    Returns the curve {"samples": [...], "loss": [...], "accuracy": [...]} on ``test``,
    evaluated about ``points`` times, so runs with different batch sizes line up by samples seen.
    """
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    steps = samples // batch
    every = max(1, steps // points)
    curve: dict[str, list[float]] = {"samples": [], "loss": [], "accuracy": []}

    def record(seen: int) -> None:
        loss, acc = evaluate(model, *test)
        curve["samples"].append(seen)
        curve["loss"].append(loss)
        curve["accuracy"].append(acc)

    record(0)
    order = torch.randperm(len(x), generator=g)
    pos = 0
    for i in range(1, steps + 1):
        if pos + batch > len(x):
            order, pos = torch.randperm(len(x), generator=g), 0
        idx = order[pos : pos + batch]
        pos += batch
        opt.zero_grad(set_to_none=True)
        step(model, F.cross_entropy, x[idx], y[idx], accum_steps)
        opt.step()
        if i % every == 0 or i == steps:
            record(i * batch)
    return curve


@dataclass(frozen=True)
class AmpCheck:
    """How an accumulated step with a GradScaler compares with one autocast full-batch step."""

    relative_error: float  # of the unscaled gradients against the full batch's
    dtype_seen: torch.dtype | None  # output dtype of the first layer during the step
    expected_dtype: torch.dtype  # what autocast gives on this device
    scale: float
    loss: float
    expected_loss: float

    def summary(self) -> str:
        return (
            f"unscaled gradients differ from one autocast batch by {self.relative_error:.2g} "
            f"(relative); first layer ran in {self.dtype_seen} (autocast: {self.expected_dtype}); "
            f"loss {self.loss:.4g} vs {self.expected_loss:.4g}; scale {self.scale:g}"
        )


def amp_check(
    step: Step,
    device: str = "cpu",
    seed: int = 0,
    batch: int = 32,
    accum_steps: int = 4,
) -> AmpCheck:
    """Run ``step(..., scaler=GradScaler(device))`` on a small MLP and compare with the
    gradients of one full batch under ``torch.autocast(device)``.

    Passing means: relative_error small (a few 1e-3 from rounding), dtype_seen equal to
    expected_dtype (the forward ran under autocast), loss equal to expected_loss.
    """
    g = torch.Generator().manual_seed(seed)
    model = seeded(lambda: mlp(32, 64, 4), seed).to(device)
    x = torch.randn(batch, 32, generator=g).to(device)
    y = torch.randint(0, 4, (batch,), generator=g).to(device)
    model.zero_grad(set_to_none=True)
    with torch.autocast(device):
        expected = F.cross_entropy(model(x), y)
    expected.backward()
    reference = gradients(model)

    seen: list[torch.dtype] = []
    hook = model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    scaler = torch.amp.GradScaler(device, init_scale=2.0**10)
    try:
        got, loss = grads_after(step, model, F.cross_entropy, x, y, accum_steps, scaler=scaler)
    finally:
        hook.remove()
    scale = float(scaler.get_scale())
    unscaled = [grad / scale for grad in got]
    return AmpCheck(
        relative_error=relative_difference(unscaled, reference),
        dtype_seen=seen[0] if seen else None,
        expected_dtype=torch.get_autocast_dtype(device),
        scale=scale,
        loss=float(loss),
        expected_loss=expected.item(),
    )


def step_variants(
    model: nn.Module, step: Step, x: Tensor, y: Tensor, accum_steps: int, lr: float = 1e-3
) -> dict[str, Callable[[], None]]:
    """Three ways to train on the same ``len(x)`` samples with AdamW, as callables:

    - "small steps": ``accum_steps`` optimizer steps of one micro-batch each,
    - "accumulated": one optimizer step over ``accum_steps`` accumulated micro-batches,
    - "big batch": one optimizer step over the whole batch at once.
    """
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    loss_fn = F.cross_entropy

    def small_steps() -> None:
        for xb, yb in zip(x.tensor_split(accum_steps), y.tensor_split(accum_steps), strict=True):
            opt.zero_grad(set_to_none=True)
            step(model, loss_fn, xb, yb, 1)
            opt.step()

    def accumulated() -> None:
        opt.zero_grad(set_to_none=True)
        step(model, loss_fn, x, y, accum_steps)
        opt.step()

    def big_batch() -> None:
        opt.zero_grad(set_to_none=True)
        full_batch_step(model, loss_fn, x, y)
        opt.step()

    return {"small steps": small_steps, "accumulated": accumulated, "big batch": big_batch}


@dataclass(frozen=True)
class AmpRow:
    """One configuration of the AMP + accumulation table."""

    precision: str
    accum_steps: int
    peak_mb: float
    ms_per_sample: float
    loss: float

    def summary(self) -> str:
        return (
            f"{self.precision:<5} {self.accum_steps:>2} micro-batches: "
            f"peak +{self.peak_mb:7.1f} MB, {self.ms_per_sample:.3f} ms/sample, "
            f"loss {self.loss:.4f}"
        )


def amp_training_table(
    step: Step,
    device: str,
    *,
    batch: int = 256,
    image: int = 128,
    channels: int = 32,
    accum: tuple[int, ...] = (1, 4),
    min_run_time: float | None = None,
) -> list[AmpRow]:
    """Train ``conv_net`` with SGD in fp32 and with autocast + GradScaler, each with every
    number of micro-batches in ``accum``: peak memory of one optimizer step (CUDA allocator
    stats on a GPU, sampled RSS on CPU) and time per sample.
    """
    rows = []
    g = torch.Generator().manual_seed(0)
    x, y = (t.to(device) for t in images(batch, image, generator=g))
    for amp in (False, True):
        for k in accum:
            model = seeded(lambda: conv_net(channels), 0).to(device)
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            scaler = torch.amp.GradScaler(device) if amp else None
            last = [math.nan]

            def one_step(model=model, opt=opt, scaler=scaler, k=k, last=last) -> None:
                opt.zero_grad(set_to_none=True)
                last[0] = float(step(model, F.cross_entropy, x, y, k, scaler=scaler))
                if scaler is None:
                    opt.step()
                else:
                    scaler.step(opt)
                    scaler.update()

            one_step()  # warm-up: kernels chosen, workspaces allocated
            memory = measure.peak_memory(one_step, device=device)
            timing = measure.time_callable(one_step, threads=None, min_run_time=min_run_time)
            rows.append(
                AmpRow(
                    "amp" if amp else "fp32",
                    k,
                    memory.peak_mb,
                    timing.median_s / batch * 1e3,
                    last[0],
                )
            )
    return rows


LAB04_CUDA = "CUDA allocator stats — NOT measured (no GPU when this lab was written)"
TARGETS: tuple[Target, ...] = (
    # Peak memory of one step, batch 64 in 4 micro-batches vs one batch (conv_net, 16 ch, no BN;
    # 64x64 images, 32x32 in smoke). CPU: sampled RSS with glibc thresholds pinned at 128 kB
    # (measure.rss_follows_tensors in the setup cell); without pinning the ratio varied
    # 1.6x-8.6x with what ran before.
    Target("04", "peak_memory", "cpu", "memory_ratio", 3.0, 1.3,
           "3.97–4.00x, median 3.98 (84.0 → 21.1 MB), 12 runs; smoke 3.81–3.98x, median 3.94 "
           "(21.0 → 5.4 MB), 12 runs; hidden-test code in notebook context, other core loaded; "
           "nbgrader autograde (smoke) 3.68–3.86x in 10 runs",
           "one-big-batch copy 1.00x (full and smoke, 10 runs each)", CPU_VM, "2026-12-02"),
    Target("04", "peak_memory", "cuda", "memory_ratio", 2.0, 1.3,
           "not measured; the course's design goal of >= 2x", "expected 1.0x (same step)",
           LAB04_CUDA, "2026-12-02"),
)  # fmt: skip
