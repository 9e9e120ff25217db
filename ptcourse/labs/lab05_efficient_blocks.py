"""Lab 05, efficient conv blocks: the standard block, FLOP/byte accounting, the inspection task,
and the graders' checks.

- :func:`baseline_block` is the standard block (3x3 conv, BatchNorm, ReLU) the lab's efficient
  block replaces; :func:`classifier` stacks either kind of block into a small inspection
  classifier with progressive downsampling.
- :func:`expected_parameters` and :func:`expected_flops` are the graders' pencil-and-paper
  counts of both blocks (FLOPs as ``FlopCounterMode`` counts them: 2 per multiply-add of convs
  and matmuls, nothing for pooling, activations or element-wise products).
- :func:`uncounted_flops` measures the element-wise pooling/scaling work ``FlopCounterMode``
  leaves out (``measure.count_bytes`` counts the bytes every op reads and writes, for a roofline).
- :func:`train_and_evaluate` gives the short, seeded training run (on
  :func:`ptcourse.assets.datasets.inspection_tensors`, each image standardised) the accuracy check
  compares.
- :func:`train_to_plateau` (one :func:`plateau_curve` per seed), :func:`plateau_of`,
  :func:`plateau_table`, :func:`plot_plateau` and :func:`claim_verdict`: the notebook's test of
  the note's claim, both classifiers trained to a plateau on several seeds (shown, not graded).
- ``check_block``, ``check_flops_formula``, ``check_flops_ratio`` and ``check_accuracy``: one per
  hidden test cell. Nothing timing-based is graded (the lab's point: FLOPs do not predict CPU
  time here).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ptcourse.assets import datasets, models
from ptcourse.core import lineup, measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import is_smoke, pick
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import CPU_VM, ZEN4_VM, Target

if TYPE_CHECKING:
    from matplotlib.axes import Axes

LAB = lineup.lab("05")

# Every check runs in the judge. Shapes, outputs and the FLOP formula are checked on data;
# parameter counts, FlopCounterMode's count and the training run come from the worker
# (checks.beside: the worker's word, docs/grading.md); test accuracy is computed here from the
# trained model's predictions on the test split.
JUDGED = ("block", "flops_formula", "flops_ratio", "accuracy")
VOUCHED = {"test_block_visible": "block", "test_flops_visible": "flops_formula"}

# Nothing timing-based is graded (the lab's point: FLOPs do not predict CPU time here).
# flops_ratio: FlopCounterMode FLOPs of baseline_block(128, 128) / the student's block on a
# (1, 128, S, S) input, S secret in [40, 64); deterministic. accuracy: test accuracy of
# classifier(student block) after train_and_evaluate with a secret seed (graded first: a block
# that ignores its input or never trains fails it, zeroing the cell); accuracy_drop: the same
# for classifier(baseline_block), same seed, minus it. Measured with SCRIPT --runs 3 on the full
# and the smoke inspection set (secret seeds 0-2); the earlier 10-seed ranges were measured on
# 2026-12-03 on a 2-core AMD EPYC VM with AVX2 and no AVX-512 (CPU_VM).
# The accuracy rows grade the short run only (150 steps at a constant learning rate): that the
# block learns and keeps up with the standard block trained the same way. The note's claim
# (-0.3% accuracy) is about trained models; the notebook tests it by training both classifiers
# to a plateau on several seeds (plateau_curve, sizes().plateau), shown and not graded: see
# SHORT_RUN_ONLY.
SCRIPT = "tools/measure/lab05_efficient_blocks.py"
RUNS = f"{SCRIPT}: 3 runs each"
SHORT_RUN_ONLY = (
    "graded on the short 150-step run (does the block learn?), not at a plateau; the claim's "
    "-0.3% is tested, not graded, by the notebook's run to a plateau on 3 seeds. "
)
TARGETS: tuple[Target, ...] = (
    Target("05", "flops_ratio", "cpu", "flops_ratio", 8.0, 1.5,
           f"{RUNS}: 8.41x (full and smoke; deterministic: 9*128/(9+128) = 8.41 plus the SE's "
           "two tiny 1x1 convs)",
           "standard block pasted as the exercise: fails before the ratio (147,712 parameters: "
           "not the block); its FLOPs ratio would be 1.00x",
           "any machine (FLOP count)", "2026-12-03", SCRIPT),
    Target("05", "accuracy", "cpu", "accuracy", 0.38, 0.34,
           f"{SHORT_RUN_ONLY}{RUNS}: reference block 0.496-0.579 (full), 0.469-0.641 (smoke); "
           "150 AdamW steps, "
           "lr 6e-3, 48x48 images. A 72-seed smoke sweep of check_accuracy's training run "
           "(2026-12-03): lowest 0.391 (seed 38; the target was 0.42 then and that seed cost "
           "the reference 0.56 of 2 points in one autograde), next lowest 0.422. 2026-12-04, "
           "smoke seeds 1000-1121: 0.375-0.766, median 0.563; 1 of 122 runs short of a target "
           "(seed 1042: 0.375, drop +0.328), as in the CI run that gave the reference 9.656/10: "
           "hence the best of up to 3 runs. Earlier, 10 seeds: 0.494-0.642 (full), 0.500-0.609 "
           "(smoke)",
           "gradient cut off (output detached), 60 smoke seeds: median 0.281, 0.406 at most, "
           "12 of 60 >= 0.34: failed first on its unchanged weights (frozen_tensors), as is a "
           "block that ignores its input: 0.250 (3 runs full, 3 smoke); standard block "
           "pasted: 0.39-0.725 "
           f"(full), 0.625-0.688 (smoke) (it is a real block). Earlier ({CPU_VM}): detached "
           "output (never trains) 0.250-0.328 (6 runs)",
           ZEN4_VM, "2026-12-03", SCRIPT),
    Target("05", "accuracy_drop", "cpu", "accuracy_drop", 0.32, 0.50,
           f"{SHORT_RUN_ONLY}{RUNS}: standard minus reference -0.158..+0.229 (full), "
           "+0.031..+0.156 (smoke); "
           "smoke seeds 1000-1121: -0.125..+0.328, median +0.094 (seed 1042 the one above 0.32). "
           "Earlier, 10 seeds: -0.246..+0.100 (full; the standard block fails to train on 1 of "
           "13 full seeds at lr 6e-3), -0.047..+0.188 (smoke); 10 smoke autogrades "
           "-0.031..+0.266 (target was 0.25 then: 9/10 full marks)",
           "standard block pasted: 0 (same block, same seed). Earlier (smoke): ignores its "
           "input +0.20..+0.48, detached +0.20..+0.41; both also fail the accuracy check",
           ZEN4_VM, "2026-12-03", SCRIPT),
)  # fmt: skip

BlockFactory = Callable[[int, int, int], nn.Module]  # (c_in, c_out, stride) -> block


@dataclass(frozen=True)
class TrainSize:
    """One training run of the inspection classifier."""

    image: int
    steps: int
    batch: int
    widths: tuple[int, ...]
    lr: float = 3e-3


@dataclass(frozen=True)
class PlateauSize:
    """The notebook's run to a plateau: ``train.steps`` AdamW steps, the learning rate warmed up
    linearly over ``warmup`` steps and then decayed to zero on a cosine, test accuracy measured
    every ``every`` steps, once per seed of ``seeds`` for each block."""

    train: TrainSize
    seeds: tuple[int, ...]
    every: int
    warmup: int


@dataclass(frozen=True)
class Sizes:
    """What lab 05 measures: the timed block, the graded training run, the run to a plateau."""

    channels: int  # the timed block maps channels -> channels ...
    side: int  # ... on side x side images
    batch: int
    budget_s: float  # seconds per interleaved timing comparison
    train: TrainSize  # the graded run (the same in smoke mode: the smoke set is smaller)
    plateau: PlateauSize  # the notebook's test of the claim (not graded)

    def __str__(self) -> str:
        return (
            f"block {self.channels} -> {self.channels} channels on "
            f"{self.batch}x{self.side}x{self.side}; graded training: {self.train}; "
            f"to a plateau: {self.plateau.train.steps} steps x {len(self.plateau.seeds)} seeds"
        )


# PLATEAU_SWEEPS: tools/measure/lab05_efficient_blocks.py --plateau, seeds 0-2, 1 thread, the
# full set, 2026-12-06 on ZEN4_VM; mean test accuracy standard/efficient, then the drop's range
# over seeds in points. NCHW (plateau_curve before it used channels_last), 32 images a step, lr
# 6e-3: 500 steps .884/.808 (+5.6..+9.2), 1000 .909/.865 (+3.1..+5.4), 2000 .936/.903
# (+2.7..+3.7), 4000 .944/.922 (+1.7..+2.7), 8000 .945/.923 (+1.2..+3.3): flat from 4000 on, but
# about 6.4 min for 3 seeds (12 + 20 ms a step).
# NCHW, 64 a step, lr 1.2e-2: 1000 .919/.896, 2000 .948/.938 (+0.2..+2.3; 1000 -> 2000 raised the
# means by 2.9 and 4.2 points), 4000 .944/.941 (+0.2..+0.4); lr 2.4e-2: 1000 .937/.917, 2000
# .941/.925 (+0.2..+2.9). channels_last (a step about 25% faster), 64 a step, lr 1.2e-2: 2000
# .947/.938 (+0.2..+1.7), 4000 .948/.945 (+0.0..+0.8): doubling 2000 moved the means by +0.0 and
# +0.7 points, less than the seeds' spread at 2000 (1.6 and 1.3 points). 2000 steps took 226 s
# for both blocks' 3 seeds in the notebook (95 s standard, 131 s efficient).
def sizes() -> Sizes:
    """The sizes for the current mode (smoke or full)."""
    # the full set has 1920 training images, the smoke set 256
    train = TrainSize(48, 150, 32, (16, 32, 64), lr=6e-3)
    # The run to a plateau (PLATEAU_SWEEPS): 64 images a step, a higher peak learning rate.
    run = TrainSize(48, 2000, 64, (16, 32, 64), lr=1.2e-2)
    return Sizes(
        channels=pick(128, 64),
        side=pick(56, 28),
        batch=pick(8, 2),
        budget_s=pick(6.0, 1.0),
        train=train,
        plateau=pick(
            PlateauSize(dataclasses.replace(run, steps=2000), (0, 1, 2), every=100, warmup=100),
            PlateauSize(dataclasses.replace(run, steps=50), (0, 1, 2), every=10, warmup=3),
        ),
    )


def baseline_block(c_in: int, c_out: int, stride: int = 1) -> nn.Sequential:
    """The standard block the lab starts from: 3x3 conv (padding 1, no bias), BatchNorm2d, ReLU."""
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
        self.elementwise = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            inputs, outputs = _tensors((args, kwargs)), _tensors(out)
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


def classifier(
    block: BlockFactory, widths: tuple[int, ...] = (16, 32, 64), num_classes: int = 4
) -> nn.Sequential:
    """Standard stem (3 -> widths[0], stride 2), then per width a stride-2 ``block`` and a
    stride-1 ``block`` (progressive downsampling), global max pool, linear head.

    Max pooling, not average: a defect covers a few pixels of the image, and averaging over the
    whole image dilutes it.
    """
    layers: list[nn.Module] = [baseline_block(3, widths[0], 2)]
    c = widths[0]
    for w in widths:
        layers += [block(c, w, 2), block(w, w, 1)]
        c = w
    return nn.Sequential(*layers, nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(c, num_classes))


def _dihedral(x: Tensor, g: torch.Generator) -> Tensor:
    """One of the 8 rotations/flips of the whole batch: defects have no preferred direction."""
    x = torch.rot90(x, int(torch.randint(4, (1,), generator=g)), (2, 3))
    return x.flip(3) if bool(torch.randint(2, (1,), generator=g)) else x


def train_and_evaluate(
    block: BlockFactory, seed: int, size: TrainSize | None = None, smoke: bool | None = None
) -> float:
    """Train ``classifier(block)`` briefly on the inspection set; return test accuracy."""
    size = size or sizes().train
    _, _, x_test, y_test = datasets.inspection_tensors(size.image, "image", smoke)
    return models.accuracy(trained_classifier(block, seed, size, smoke), x_test, y_test)


def trained_classifier(
    block: BlockFactory, seed: int, size: TrainSize | None = None, smoke: bool | None = None
) -> nn.Module:
    """``classifier(block)`` after a brief training on the inspection set, in eval mode.

    AdamW at a constant learning rate on :func:`_batches`. Weights, batch order and
    augmentation come from ``seed``; the global RNG is left as it was.
    """
    size = size or sizes().train
    x_train, y_train, _, _ = datasets.inspection_tensors(size.image, "image", smoke)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classifier(block, size.widths)
        start = [p.detach().clone() for p in _block_parameters(model)]
        models.train_steps(model, _batches(x_train, y_train, size, seed), size.steps, lr=size.lr)
    after = [p.detach() for p in _block_parameters(model)]
    model.frozen_tensors = sum(torch.equal(a, b) for a, b in zip(start, after, strict=True))
    return model.eval()


def _batches(x: Tensor, y: Tensor, size: TrainSize, seed: int) -> Iterator[tuple[Tensor, Tensor]]:
    """``size.steps`` batches drawn without replacement (epoch after epoch), each randomly
    rotated or flipped; made one at a time, from a generator seeded with ``seed``."""
    g = torch.Generator().manual_seed(seed)
    epochs = -(-size.steps * size.batch // len(x))
    order = torch.cat([torch.randperm(len(x), generator=g) for _ in range(epochs)])
    for i in order[: size.steps * size.batch].split(size.batch):
        yield _dihedral(x[i], g), y[i]


def _block_parameters(model: nn.Sequential) -> list[Tensor]:
    """The parameters of ``classifier``'s ``block`` layers (not the stem, not the head)."""
    return [p for layer in list(model)[1:-3] for p in layer.parameters()]


def frozen_tensors(model: nn.Module) -> int:
    """How many of the block layers' parameter tensors :func:`trained_classifier` left as they
    started: a block cut off from the loss's gradient (``detach``, ``no_grad``, frozen weights)
    keeps all of them, a block that ignores its input most. Such a classifier still scores
    above chance on some seeds (the head learns from random features), so the accuracy check
    fails it on this count first."""
    return int(getattr(model, "frozen_tensors", 0))


def predicted_classes(model: nn.Module, x: Tensor, batch_size: int = 256) -> Tensor:
    """``model``'s class for each image of ``x``, in eval mode, without gradients."""
    model.eval()
    with torch.no_grad():
        return torch.cat(
            [model(x[i : i + batch_size]).argmax(dim=1) for i in range(0, len(x), batch_size)]
        )


def split_accuracy(model: Any, size: TrainSize | None = None) -> float:
    """Accuracy of ``model`` (here, or in the judge's worker) on the inspection test split,
    computed here from the classes it predicts."""
    size = size or sizes().train
    _, _, x_test, y_test = datasets.inspection_tensors(size.image, "image", None)
    predicted = checks.beside(model, predicted_classes, x_test)
    if not isinstance(predicted, Tensor) or predicted.shape != y_test.shape:
        raise checks.CheckFailed("the trained classifier does not give one class per image")
    return float((predicted == y_test).float().mean())


def accuracies(block: BlockFactory, seed: int) -> dict[str, float]:
    """Test accuracy of the student's block and of the standard block, each after the graded
    training run with ``seed``."""
    with captured_stderr():
        mine = checks.beside(block, trained_classifier, seed, keep=True)
        frozen = checks.beside(mine, frozen_tensors)
        if frozen:
            raise checks.CheckFailed(
                f"{frozen} parameter tensors of your blocks did not change in training: does the "
                "gradient reach them (detach, no_grad, requires_grad=False, an ignored input)?"
            )
        standard = trained_classifier(baseline_block, seed)
        found = {"efficient": split_accuracy(mine), "standard": split_accuracy(standard)}
    print(f"test accuracy: standard {found['standard']:.3f}, yours {found['efficient']:.3f}")
    return found


# ---------------------------------------------------------------------------------------------
# The claim: both classifiers trained to a plateau, several seeds (shown, not graded).

# "-0.3% accuracy" (the lineup row's claim), read as 0.3 percentage points of test accuracy.
CLAIMED_DROP = 0.003
CLAIM = LAB.claim


@dataclass(frozen=True)
class Curve:
    """One run to a plateau: test accuracy after each evaluated step, and the training time."""

    steps: tuple[int, ...]
    accuracy: tuple[float, ...]
    seconds: float  # the training steps only, not the evaluations

    @property
    def final(self) -> float:
        return self.accuracy[-1]

    def at(self, step: int) -> float:
        """Test accuracy at the last evaluation not after ``step``."""
        return max((s, a) for s, a in zip(self.steps, self.accuracy, strict=True) if s <= step)[1]


def warmup_cosine(step: int, warmup: int, steps: int) -> float:
    """Learning-rate factor at ``step`` (0-based): linear warm-up, then a cosine decay to 0."""
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(steps - warmup, 1)))


def plateau_curve(
    block: BlockFactory, seed: int, size: PlateauSize | None = None, smoke: bool | None = None
) -> Curve:
    """Train ``classifier(block)`` on the inspection set with :func:`warmup_cosine`'s schedule;
    test accuracy every ``size.every`` steps. The same initial weights for a seed as the graded
    run (:func:`trained_classifier`), batches made the same way; the global RNG is left as it
    was. Model and batches are channels_last: on the course's machine a training step of
    either classifier took about a quarter less time than in NCHW."""
    size = size or sizes().plateau
    run = size.train
    x_train, y_train, x_test, y_test = datasets.inspection_tensors(run.image, "image", smoke)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = classifier(block, run.widths).to(memory_format=torch.channels_last)
    opt = torch.optim.AdamW(model.parameters(), lr=run.lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda step: warmup_cosine(step, size.warmup, run.steps)
    )
    steps, accuracy, seconds = [], [], 0.0
    for step, (x, y) in enumerate(_batches(x_train, y_train, run, seed), start=1):
        start = time.perf_counter()
        model.train()
        loss = F.cross_entropy(model(x.contiguous(memory_format=torch.channels_last)), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        schedule.step()
        seconds += time.perf_counter() - start
        if step % size.every == 0 or step == run.steps:
            steps.append(step)
            accuracy.append(models.accuracy(model, x_test, y_test))
    return Curve(tuple(steps), tuple(accuracy), seconds)


@dataclass(frozen=True)
class Plateau:
    """Runs to a plateau of named blocks ("standard", "efficient"), one curve per seed."""

    seeds: tuple[int, ...]
    curves: dict[str, tuple[Curve, ...]]
    test_images: int

    def finals(self, name: str) -> list[float]:
        return [curve.final for curve in self.curves[name]]

    def drops(self) -> list[float]:
        """Per seed: the standard block's final test accuracy minus the efficient block's."""
        pairs = zip(self.finals("standard"), self.finals("efficient"), strict=True)
        return [standard - efficient for standard, efficient in pairs]

    def late_gain(self, name: str) -> float:
        """Mean over seeds of the final accuracy minus the accuracy three quarters of the way:
        about 0 once a run has reached its plateau."""
        curves = self.curves[name]
        return sum(c.final - c.at(3 * c.steps[-1] // 4) for c in curves) / len(curves)


def train_to_plateau(
    name: str, block: BlockFactory, size: PlateauSize | None = None, smoke: bool | None = None
) -> tuple[Curve, ...]:
    """:func:`plateau_curve` of ``block`` on every seed of ``size.seeds``, one line printed per
    run (``name`` labels it)."""
    size = size or sizes().plateau
    run = size.train
    print(f"{name}: {run.steps} steps of {run.batch} images, peak learning rate {run.lr:g} "
          f"(warm-up {size.warmup} steps, cosine to 0), seeds {list(size.seeds)}")  # fmt: skip
    curves = []
    for seed in size.seeds:
        curves.append(plateau_curve(block, seed, size, smoke))
        print(f"seed {seed}: {name:>9} test accuracy {curves[-1].final:.3f} after "
              f"{curves[-1].steps[-1]} steps ({curves[-1].seconds:.0f} s)", flush=True)  # fmt: skip
    return tuple(curves)


def plateau_of(
    curves: dict[str, tuple[Curve, ...]], size: PlateauSize | None = None, smoke: bool | None = None
) -> Plateau:
    """The runs of :func:`train_to_plateau` by block name ("standard", "efficient"), for the
    table, the plot and the verdict."""
    size = size or sizes().plateau
    test = len(datasets.inspection_tensors(size.train.image, "image", smoke)[3])
    return Plateau(size.seeds, curves, test)


def plateau_table(found: Plateau) -> str:
    """Per seed both final accuracies and the drop, then the drop's spread and the late gains."""
    lines = [f"{'seed':>4} {'standard':>9} {'efficient':>9} {'drop (points)':>14}"]
    columns = (found.seeds, found.finals("standard"), found.finals("efficient"), found.drops())
    for seed, standard, efficient, drop in zip(*columns, strict=True):
        lines.append(f"{seed:>4} {standard:>9.3f} {efficient:>9.3f} {drop * 100:>+14.1f}")
    drops = found.drops()
    lines.append(
        f"drop over {len(drops)} seeds: {min(drops) * 100:+.1f} to {max(drops) * 100:+.1f} "
        f"points (mean {sum(drops) / len(drops) * 100:+.1f}); one test image is "
        f"{100 / found.test_images:.2f} points"
    )
    lines.append(
        "over the last quarter of the schedule test accuracy moved "
        + ", ".join(f"{found.late_gain(n) * 100:+.1f} points ({n})" for n in found.curves)
        + " (mean over seeds)"
    )
    return "\n".join(lines)


def claim_verdict(drops: Sequence[float], claimed: float = CLAIMED_DROP) -> str:
    """One sentence from measured drops (standard minus efficient accuracy, one per seed):
    whether the claim of at most ``claimed`` held on every seed, on none, or the seeds disagree."""
    low, high, mean = min(drops), max(drops), sum(drops) / len(drops)
    measured = (
        f"The efficient block's test accuracy was {mean * 100:+.1f} points below the standard "
        f"block's on average (seeds: {low * 100:+.1f} to {high * 100:+.1f}; negative: above it)"
    )
    if high <= claimed:
        verdict = f"the claim of {claimed * 100:.1f} points held here on every seed."
    elif low > claimed:
        verdict = f"the claim of {claimed * 100:.1f} points did not hold here on any seed."
    else:
        verdict = (
            f"the seeds disagree, so {len(drops)} seeds cannot say whether the claim of "
            f"{claimed * 100:.1f} points holds here."
        )
    note = " (Smoke sizes: not a plateau, not a result.)" if is_smoke() else ""
    return f"{measured}: {verdict}{note}"


def plot_plateau(found: Plateau, ax: Axes | None = None) -> Axes:
    """Test accuracy against training step, one line per block and seed."""
    import matplotlib.pyplot as plt  # lazy: the judge imports this module and never plots

    from ptcourse.core import plots

    if ax is None:
        _, ax = plt.subplots(figsize=(7.0, 4.2), layout="constrained")
    colors = {"standard": "0.45", "efficient": plots.PASS_COLOR}
    for name, curves in found.curves.items():
        for i, curve in enumerate(curves):
            label = name if i == 0 else None
            ax.plot(curve.steps, curve.accuracy, color=colors.get(name), label=label, alpha=0.8)
    ax.set_xlabel("training step (cosine schedule)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"To a plateau: {len(found.seeds)} seeds per block")
    ax.grid(alpha=0.3)
    ax.legend()
    return ax


def parameter_count(module: nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def flops_of(module: nn.Module, x: Tensor) -> int:
    """FlopCounterMode's count of ``module(x)`` in eval mode."""
    module.eval()
    with torch.no_grad():
        return measure.count_flops(lambda: module(x))


def roofline_point(flops: int, nbytes: int, seconds: float) -> tuple[float, float]:
    """(arithmetic intensity in FLOP/byte, achieved FLOP/s) for plots.roofline."""
    return flops / max(nbytes, 1), flops / seconds


# ---------------------------------------------------------------------------------------------
# The checks: one per hidden test cell, on configurations and seeds drawn from a secret seed.


def _draw(gen: torch.Generator, low: int, high: int, count: int = 1) -> list[int]:
    return [int(v) for v in torch.randint(low, high, (count,), generator=gen)]


def check_block(block: BlockFactory, *, points: float) -> float:
    """Output shapes and exact parameter counts of ``block`` on 4 fresh configurations."""
    gen = checks.secret_generator()
    for _ in range(4):
        c_in, c_out = _draw(gen, 4, 80, 2)
        (stride,), (side,) = _draw(gen, 1, 3), _draw(gen, 5, 20)
        with captured_stderr():
            built = block(c_in, c_out, stride)
            out = built(torch.randn(2, c_in, side, side, generator=gen))
        want = (2, c_out, out_size(side, stride), out_size(side, stride))
        if not isinstance(out, Tensor) or tuple(out.shape) != want:
            raise checks.CheckFailed(
                f"{c_in}->{c_out}, stride {stride}, {side}x{side}: shape "
                f"{tuple(getattr(out, 'shape', ()))}, expected {want}"
            )
        n = checks.beside(built, parameter_count)
        expected = expected_parameters("efficient", c_in, c_out)
        if n != expected:
            raise checks.CheckFailed(f"{c_in}->{c_out}: {n} parameters, expected {expected}")
    print("shapes and parameter counts exact on 4 fresh configurations")
    return float(points)


def check_flops_formula(efficient_block_flops: Callable[..., int], *, points: float) -> float:
    """The student's FLOP formula against :func:`expected_flops` on 6 fresh configurations."""
    gen = checks.secret_generator()
    for _ in range(6):
        c_in, c_out, side = _draw(gen, 3, 200, 3)
        (stride,), (batch,) = _draw(gen, 1, 3), _draw(gen, 1, 9)
        want = expected_flops("efficient", c_in, c_out, side, side + 1, stride, batch).total
        with captured_stderr():
            got = efficient_block_flops(c_in, c_out, side, side + 1, stride, batch)
        if type(got) not in (int, float) or got != want:
            raise checks.CheckFailed(
                f"{c_in}->{c_out} on {batch}x{side}x{side + 1}, stride {stride}: {got!r}, "
                f"expected {want}"
            )
    print("the FLOP formula is exact on 6 fresh configurations")
    return float(points)


def eval_output(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` in eval mode, without gradients."""
    module.eval()
    with torch.no_grad():
        return module(x)


def check_flops_ratio(block: BlockFactory, *, points: float) -> float:
    """FlopCounterMode FLOPs of ``baseline_block(128, 128)`` over ``block(128, 128)`` on a
    (1, 128, S, S) input, S secret in [40, 64); only for a block with the specified parameters
    (a lone 1x1 conv would also have few FLOPs)."""
    gen = checks.secret_generator()
    (side,) = _draw(gen, 40, 64)
    xs = torch.randn(1, 128, side, side, generator=gen)
    with captured_stderr():
        mine = block(128, 128, 1)
        theirs = baseline_block(128, 128)
        out = checks.beside(mine, eval_output, xs)
    if not isinstance(out, Tensor) or out.shape != eval_output(theirs, xs).shape:
        raise checks.CheckFailed("the block must keep C and the image size")
    n = checks.beside(mine, parameter_count)
    if n != expected_parameters("efficient", 128, 128):
        raise checks.CheckFailed(f"{n} parameters: not the block")

    def flops_ratio() -> float:
        return flops_of(theirs, xs) / max(int(checks.beside(mine, flops_of, xs)), 1)

    return checks.value(targets.goal(TARGETS, "flops_ratio"), flops_ratio, points=points)


# A correct block's 150-step run misses a target on a few seeds in a hundred (smoke sweeps, see
# the accuracy rows), so check_accuracy grades the best of up to this many runs (checks.best_run).
ATTEMPTS = 3


def check_accuracy(block: BlockFactory, *, points: float) -> float:
    """Test accuracy after the short training run with a secret seed: half the points for the
    student's block learning at all (``accuracy``; below its floor the check fails), half for
    its drop against :func:`baseline_block` trained the same way (``accuracy_drop``). A run
    short of full credit is repeated with the next seed, :data:`ATTEMPTS` runs at most, and the
    best run is graded."""
    learns, keeps_up = targets.goal(TARGETS, "accuracy"), targets.goal(TARGETS, "accuracy_drop")

    def credit_of(found: dict[str, float]) -> float:  # a run that fails `accuracy` ranks last
        learned = checks.credit(learns, found["efficient"])
        drop = found["standard"] - found["efficient"]
        return (learned + checks.credit(keeps_up, drop)) / 2 if learned > 0 else 0.0

    best = checks.best_run(lambda seed: accuracies(block, seed), credit_of, attempts=ATTEMPTS)
    learned = checks.value(learns, lambda: best["efficient"], points=points / 2)
    return learned + checks.value(
        keeps_up, lambda: best["standard"] - best["efficient"], points=points / 2
    )
