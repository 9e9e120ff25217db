"""Lab 05, efficient conv blocks: the standard block, FLOP/byte accounting, the inspection task.

- :func:`standard_block` is the baseline (3x3 conv, BatchNorm, ReLU) the lab's efficient block
  replaces; :func:`classifier` stacks either kind of block into a small inspection classifier
  with progressive downsampling.
- :func:`expected_parameters` and :func:`expected_flops` are the graders' pencil-and-paper
  counts of both blocks (FLOPs as ``FlopCounterMode`` counts them: 2 per multiply-add of convs
  and matmuls, nothing for pooling, activations or element-wise products).
- :func:`uncounted_flops` and :func:`count_bytes` measure what ``FlopCounterMode`` leaves out:
  element-wise pooling/scaling work, and the bytes every op reads and writes (for a roofline).
- :func:`inspection_tensors` and :func:`train_and_evaluate` give the short, seeded training run
  the accuracy check compares.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ptcourse.assets import datasets, models
from ptcourse.core.smoke import is_smoke
from ptcourse.grading.targets import CPU_VM, Target

BlockFactory = Callable[[int, int, int], nn.Module]  # (c_in, c_out, stride) -> block


def standard_block(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """The baseline block: 3x3 conv (padding 1, no bias), BatchNorm2d, ReLU."""
    return nn.Sequential(
        nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(c_out),
        nn.ReLU(inplace=True),
    )


def se_channels(c_in: int) -> int:
    """Hidden width of the squeeze-and-excitation bottleneck: a quarter, at least 8."""
    return max(8, c_in // 4)


def out_size(size: int, stride: int) -> int:
    """Spatial size after a 3x3 conv with padding 1 and ``stride``."""
    return (size - 1) // stride + 1


def expected_parameters(kind: str, c_in: int, c_out: int) -> int:
    """Parameters of a ``"standard"`` or ``"efficient"`` block, as the lab specifies them."""
    if kind == "standard":
        return 9 * c_in * c_out + 2 * c_out
    if kind == "efficient":
        r = se_channels(c_in)
        depthwise = 9 * c_in + 2 * c_in  # 3x3 per channel + BatchNorm
        squeeze = c_in * r + r + r * c_in + c_in  # two 1x1 convs with bias
        pointwise = c_in * c_out + 2 * c_out  # 1x1 conv + BatchNorm
        return depthwise + squeeze + pointwise
    raise ValueError(f"kind must be 'standard' or 'efficient', got {kind!r}")


@dataclass(frozen=True)
class Flops:
    """FLOPs of one block call: what FlopCounterMode counts, and what it misses."""

    counted: int  # convs/matmuls, 2 per multiply-add
    uncounted: int  # SE pooling (1 per element averaged) + SE scaling (1 per element scaled)

    @property
    def total(self) -> int:
        return self.counted + self.uncounted


def expected_flops(
    kind: str, c_in: int, c_out: int, height: int, width: int, stride: int = 1, batch: int = 1
) -> Flops:
    """Pencil-and-paper FLOPs of one forward call of a block on a (batch, c_in, H, W) input."""
    pixels = out_size(height, stride) * out_size(width, stride)
    if kind == "standard":
        return Flops(2 * batch * pixels * c_out * c_in * 9, 0)
    if kind == "efficient":
        r = se_channels(c_in)
        depthwise = 2 * pixels * c_in * 9
        squeeze = 2 * (c_in * r + r * c_in)  # on the pooled (c_in, 1, 1) vector
        pointwise = 2 * pixels * c_in * c_out
        return Flops(batch * (depthwise + squeeze + pointwise), batch * 2 * c_in * pixels)
    raise ValueError(f"kind must be 'standard' or 'efficient', got {kind!r}")


_aten = torch.ops.aten
_REDUCTIONS = {
    _aten.mean.dim, _aten.mean.default, _aten.sum.dim_IntList, _aten.sum.default,
    _aten._adaptive_avg_pool2d.default, _aten.avg_pool2d.default,
}  # fmt: skip
_PRODUCTS = {_aten.mul.Tensor, _aten.mul_.Tensor}


def _tensors(tree: Any) -> list[Tensor]:
    return [t for t in tree_flatten(tree)[0] if isinstance(t, Tensor)]


class _Accounting(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.bytes = 0
        self.elementwise = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            inputs, outputs = _tensors((args, kwargs)), _tensors(out)
            self.bytes += sum(t.numel() * t.element_size() for t in inputs + outputs)
            if func in _REDUCTIONS and inputs:
                self.elementwise += inputs[0].numel()
            elif func in _PRODUCTS and outputs:
                # only products of a big tensor with a broadcast one (the SE's scaling)
                big, small = (t.numel() for t in inputs[:2]) if len(inputs) >= 2 else (0, 0)
                if big != small:
                    self.elementwise += outputs[0].numel()
        return out


def uncounted_flops(fn: Callable[[], Any]) -> int:
    """Element-wise FLOPs FlopCounterMode skips: 1 per element averaged or summed by a
    reduction/pooling op, 1 per output element of a broadcast multiply (SE scaling)."""
    with torch.no_grad(), _Accounting() as acc:
        fn()
    return acc.elementwise


def count_bytes(fn: Callable[[], Any]) -> int:
    """Bytes every (non-view) op of one call reads and writes: inputs, weights and outputs.

    A lower bound on memory traffic if nothing stayed in cache between ops, an upper bound on
    what a fused implementation would need; good enough to place a block on a roofline.
    """
    with torch.no_grad(), _Accounting() as acc:
        fn()
    return acc.bytes


def classifier(
    block: BlockFactory, widths: tuple[int, ...] = (16, 32, 64), num_classes: int = 4
) -> nn.Sequential:
    """Standard stem (3 -> widths[0], stride 2), then per width a stride-2 ``block`` and a
    stride-1 ``block`` (progressive downsampling), global max pool, linear head.

    Max pooling, not average: a defect covers a few pixels of the image, and averaging over the
    whole image dilutes it.
    """
    layers: list[nn.Module] = [standard_block(3, widths[0], 2)]
    c = widths[0]
    for w in widths:
        layers += [block(c, w, 2), block(w, w, 1)]
        c = w
    return nn.Sequential(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def _load(path: Any, size: int) -> np.ndarray:
    with Image.open(path) as image:
        small = image.convert("RGB").resize((size, size), Image.Resampling.BILINEAR)
    return np.asarray(small).transpose(2, 0, 1)


@functools.cache
def _inspection(size: int, smoke: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    train, test = datasets.inspection_splits(smoke)

    def stack(files: list) -> tuple[Tensor, Tensor]:
        x = torch.from_numpy(np.stack([_load(p, size) for p, _ in files])).float() / 255
        return x, torch.tensor([label for _, label in files])

    x_train, y_train = stack(train)
    x_test, y_test = stack(test)
    return _standardise(x_train), y_train, _standardise(x_test), y_test


def _standardise(x: Tensor) -> Tensor:
    # per image: the three textures differ in tint and brightness, the defects in local contrast
    return (x - x.mean(dim=(1, 2, 3), keepdim=True)) / x.std(dim=(1, 2, 3), keepdim=True)


def inspection_tensors(
    size: int, smoke: bool | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Inspection images resized to ``size`` x ``size``, each standardised to mean 0, std 1:
    (x_train, y_train, x_test, y_test). Decoded once per process and size."""
    return _inspection(size, is_smoke() if smoke is None else smoke)


@dataclass(frozen=True)
class TrainSize:
    image: int
    steps: int
    batch: int
    widths: tuple[int, ...]
    lr: float = 3e-3


def train_size(smoke: bool | None = None) -> TrainSize:
    """The short training run of the lab (smaller in smoke mode)."""
    smoke = is_smoke() if smoke is None else smoke
    # same run; the full set has 1920 training images, the smoke set 256
    return TrainSize(48, 150, 32, (16, 32, 64), lr=6e-3)


def _dihedral(x: Tensor, g: torch.Generator) -> Tensor:
    """One of the 8 rotations/flips of the whole batch: defects have no preferred direction."""
    x = torch.rot90(x, int(torch.randint(4, (1,), generator=g)), (2, 3))
    return x.flip(3) if bool(torch.randint(2, (1,), generator=g)) else x


def train_and_evaluate(
    block: BlockFactory, seed: int, size: TrainSize | None = None, smoke: bool | None = None
) -> float:
    """Train ``classifier(block)`` briefly on the inspection set; return test accuracy.

    AdamW, batches drawn without replacement (epoch after epoch), each batch randomly rotated
    or flipped. Weights, batch order and augmentation come from ``seed``; the global RNG is
    left as it was.
    """
    size = size or train_size(smoke)
    x_train, y_train, x_test, y_test = inspection_tensors(size.image, smoke)
    g = torch.Generator().manual_seed(seed)
    epochs = -(-size.steps * size.batch // len(x_train))
    order = torch.cat([torch.randperm(len(x_train), generator=g) for _ in range(epochs)])
    batches = [
        (_dihedral(x_train[i], g), y_train[i])
        for i in order[: size.steps * size.batch].split(size.batch)
    ]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classifier(block, size.widths)
        models.train_steps(model, batches, size.steps, lr=size.lr)
    return models.accuracy(model, x_test, y_test)


def roofline_point(flops: int, nbytes: int, seconds: float) -> tuple[float, float]:
    """(arithmetic intensity in FLOP/byte, achieved FLOP/s) for plots.roofline."""
    return flops / max(nbytes, 1), flops / seconds


# Lab 05: nothing timing-based is graded (the lab's point: FLOPs do not predict CPU time here).
# flops_ratio: FlopCounterMode FLOPs of blocks.standard_block(128, 128) / the student's block on
# a (1, 128, S, S) input, S secret in [40, 64); deterministic. accuracy_drop: test accuracy of
# blocks.classifier(standard_block) minus classifier(student block) after
# blocks.train_and_evaluate with a secret seed (both trained in the hidden test).
TARGETS: tuple[Target, ...] = (
    Target("05", "flops_ratio", "cpu", "flops_ratio", 8.0, 1.5,
           "8.406-8.408x for S in 40..63 (deterministic; 9*128/(9+128) = 8.41 plus the SE's "
           "two tiny 1x1 convs)",
           "standard block pasted as the exercise: 1.00x", "any machine (FLOP count)",
           "2026-12-02"),
    # The student's accuracy is graded first (a block that ignores its input or never trains
    # fails it, zeroing the cell); then the drop against the standard block, same seed.
    Target("05", "accuracy", "cpu", "accuracy", 0.42, 0.34,
           "reference block 0.500-0.609 (smoke, 10 seeds), 0.494-0.642 (full, 10 seeds); "
           "150 AdamW steps, lr 6e-3, 48x48 images",
           "broken blocks: ignores its input 0.250 (6 runs), detached output (never trains) "
           "0.250-0.328 (6 runs); standard block pasted: 0.45-0.79 (passes, it is a real block)",
           CPU_VM, "2026-12-03"),
    Target("05", "accuracy_drop", "cpu", "accuracy_drop", 0.32, 0.50,
           "standard minus reference: -0.047..+0.188 (smoke, 10 seeds), -0.246..+0.100 (full, "
           "10 seeds; the standard block fails to train on 1 of 13 full seeds at lr 6e-3); "
           "10 smoke autogrades -0.031..+0.266 (target was 0.25 then: 9/10 full marks)",
           "ignores its input +0.20..+0.48 (smoke), detached +0.20..+0.41 (smoke); both also "
           "fail the accuracy check", CPU_VM, "2026-12-03"),
)  # fmt: skip
