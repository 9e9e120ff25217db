"""Lab 08, TensorRT's ideas on a CPU: layer fusion, graph optimisation, reduced precision.

- :func:`deployed_model` is the lab's inspection classifier in eval mode: ``models.tiny_cnn``
  (Conv+BN+ReLU blocks) whose BatchNorm layers hold realistic, non-trivial statistics, so
  folding them into the convs changes every weight. :func:`baseline_fuse_conv_bn` and
  :func:`baseline_to_bf16` are what the two timed exercises start from: the model as it is.
- :func:`reference_fold` and :func:`reference_fuse` are the graders' references: PyTorch's own
  ``fuse_conv_bn_eval`` and the torch.fx pass ``torch.fx.experimental.optimization.fuse``;
  :func:`reference_fuse_conv_bn` is the solution of exercise 2 (a torch.fx pass of its own),
  timed next to the student's model by the fusion speed check.
- :func:`export` and :func:`optimized_graph` turn a model into ONNX and read back the graph
  ONNX Runtime actually runs at each optimisation level (sessions from
  :mod:`ptcourse.assets.onnx_runtime`).
- :func:`inspection_model` is a classifier with a head fitted on the inspection images, for the
  precision experiment: how many predictions (and how much accuracy) bf16 changes.
- ``check_*``: the graders of the notebook's hidden test cells, one per cell, all run by the
  judge (``JUDGED``): the answers' outputs, optimised graphs and times are checked there; what a
  returned model is made of (BatchNorms left, operators called, bf16 layers) is read beside it
  (``checks.beside``), where it runs.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import io
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ptcourse.assets import datasets, models, onnx_runtime
from ptcourse.core import hardware, lineup, measure, numerics, seeds
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import is_smoke
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import ZEN4_VM, Target

LAB = lineup.lab("08")

# Lab 08: measured by tools/measure/lab08_tensorrt.py (through the checks below; --smoke for the
# smoke-size dataset) on a machine that other jobs also loaded heavily (load average 10–15 on its
# 2 cores). Earlier numbers from the 2-core AVX2-only AMD EPYC VM the lab was written on
# (targets.CPU_VM, 2026-12-03, hidden-test code) are quoted where they explain a target.
# Checks the judge runs outside the student's process, and the quick tests they vouch for.
# What the worker reports (checks.beside, see docs/grading.md): BatchNorm modules left in a
# fused model and in the model it was given, the operators a fused model calls (bn_folded, where
# fusion speed is not gradable) and the share of bf16 conv/linear outputs (bf16_in_effect, where
# bf16 speed is not). Outputs, optimised graphs, accuracy and time are the judge's.
JUDGED = ("fold", "fuse", "fusion_speed", "ort", "bf16_accuracy", "bf16_speed")
VOUCHED = {
    "test_fold_visible": "fold",
    "test_fuse_visible": "fuse",
    "test_bf16_visible": "bf16_speed",
}
SCRIPT = "tools/measure/lab08_tensorrt.py"
NOT_MEASURED = "NOT measured (no GPU when this lab was written)"
TARGETS: tuple[Target, ...] = (
    # Batch-1 latency of deployed_model (tiny_cnn 16 ch, 32x32) with BatchNorm folded (torch.fx
    # GraphModule) vs the original, eager, 1 thread. Same sizes in smoke and full. Graded
    # relative to reference_fuse_conv_bn timed in the same run (checks.speed_check): full
    # credit at floor + 70% of the reference's gain here, at most `target`; where the reference
    # does not clear `floor` the points grade bn_folded instead.
    Target(LAB.number, "fusion_latency", "cpu", "speedup", 1.2, 1.1,
           f"{SCRIPT}, relative check (reference_fuse_conv_bn in the same run): the solution's "
           "fuse_conv_bn 1.16–1.22x, median 1.2 (4 runs, load average < 2), the reference here "
           "1.18–1.23x, full credit at 1.159–1.19x, points 2.9–3, median 3 of 3, speed gradable "
           "in 8 of 8 runs. Before (fixed row, checks.speedup): 1.18–1.36x, median 1.19 (5 runs), "
           "1.05–1.26x, median 1.16 (10 runs; load average 10–15) and 1.05–1.36x, median 1.21 "
           "(10 runs; load average 5–7), points per run median 2.73, 1.9 and 3 of 3, 0 in 2 of "
           "25; on the AVX2 VM (targets.CPU_VM, quieter) 1.267–1.318x, median 1.284 (full), "
           "1.274–1.350x, median 1.29 (smoke), 12 runs each. In the judge (smoke, blocks of 128 "
           "calls, load average 2.4–3.8, 2026-12-03): the solution 1.21–1.29x, the reference "
           "1.19–1.27x, 3/3 in 6 of 6 runs; with a block sized from one call (the round trip "
           "included) the solution measured 0.73x against the reference's 1.5x once",
           f"{SCRIPT}: unfolded copy 0.986–1.01x, median 0.994 (4 runs, the reference here "
           "1.19–1.2x): 0 points in 4 of 4. Before (fixed row): 0.879–1.02x, median 0.944 "
           "(5 runs), 0.127–1.07x, median 0.989 (10 runs), 0.791–3.75x, median 0.985 (10 runs): "
           "0 points in the first 15 runs, median 0 in the last 10, where one load stall gave "
           "3.75x and 3/3. In the judge: BatchNorms renamed (F.batch_norm under another "
           "module) 1.02x against the reference's 1.17x, speed not gradable in 2 of 3 runs "
           "(bn_folded 0): 0 points in 3 of 3",
           ZEN4_VM, "2026-12-03", SCRIPT),
    # Where fusion speed is not gradable (the reference below the floor): the share of the
    # original's BatchNorms the fused model folded away (folded_share: batch-norm operator calls
    # gone and operator calls saved, per BatchNorm).
    Target(LAB.number, "bn_folded", "cpu", "score", 1.0, 0.0,
           f"{SCRIPT}: the solution's fuse_conv_bn 1.0 in 4 of 4 runs (15 aten calls per forward "
           "→ 11, no batch-norm left)",
           f"{SCRIPT}: unfolded copy 0.0 in 4 of 4 runs (4 batch-norm calls left); the unit "
           "tests' BatchNorm renamed (F.batch_norm) or written out elementwise: 0.0",
           ZEN4_VM, "2026-12-03", SCRIPT),
    # |accuracy(bf16) − accuracy(fp32)| of inspection_model (linear probe: 24–32% full, 14–44%
    # smoke, on 4 classes) on the inspection test split: 64 images smoke, 480 full.
    Target(LAB.number, "bf16_accuracy_change", "cpu", "accuracy_drop", 0.05, 0.15,
           f"{SCRIPT}: |change| 0–0.0104, median 0.0042 (full, 5 runs; fp32 accuracy 0.25–0.31), "
           "0–0.0469, median 0.0078 (smoke, 10 runs; flips ≤ 11%); logits 2–5% relative. Over "
           "seeds 0–199 (smoke) |change| ≤ 0.0469 (3 of 64 images), over seeds 0–23 (full) "
           "≤ 0.0104",
           f"{SCRIPT}: fp32 copy 0 in every run (2/2 points: not a speed check)",
           ZEN4_VM, "2026-12-03", SCRIPT),
    # Where bf16 is slow (no AMX/avx512_bf16, or kernels not using them) the speed cell grades
    # instead that every Conv2d/Linear output is bf16 (low_precision_share).
    Target(LAB.number, "bf16_in_effect", "cpu", "score", 1.0, 0.0,
           f"{SCRIPT}: 1.0 in 15 of 15 runs (5 full, 10 smoke)",
           f"{SCRIPT}: fp32 copy 0.0 in 15 of 15 runs", ZEN4_VM, "2026-12-03", SCRIPT),
    # Batch 16 at 64 px, fp32 vs the bf16 copy, 1 thread; graded only where fast_bf16(), and
    # relative to reference_to_bf16 timed in the same run (full credit at the floor + 70% of
    # its gain, at most this target; where the reference does not clear the floor the points
    # grade bf16_in_effect: tools/grading_matrix.py measured the reference at 0.65x with
    # ATEN_CPU_CAPABILITY=default on the Zen 4 VM, matmuls fast, the rest scalar). On the Intel
    # AMX VM (2026-12-07), every contender timed in blocks of the same length
    # (measure.shared_calls), the reference measured 1.19-1.26x in the judge in 4 runs and the
    # fusion reference 1.12-1.16x: neither clears its floor by 10% there, so both grade the
    # technique.
    Target(LAB.number, "bf16_speed", "cpu", "speedup", 1.3, 1.15,
           f"{SCRIPT}: 1.29–1.67x, median 1.44 (5 runs, load average ~15) and 1.85–2.66x, median "
           "2.02 (10 runs, load average ~11), full size; 2.59–2.74x with the machine idle. In "
           "the judge (smoke, blocks of 16 calls, load average 2.4–3.8, 2026-12-03): the "
           "solution 1.36–1.49x against the reference's 1.48–1.53x in 4 runs, speed not "
           "gradable in 2 of 6 (the reference's interval reached the floor; bf16 in effect "
           "graded), 2/2 in 6 of 6",
           f"{SCRIPT}: fp32 copy 0.879–1.13x, median 1.0–1.07, 0 points in 15 of 15 runs; in the "
           "judge 0.95–0.99x in 3 runs, not gradable in 1 (bf16_in_effect 0): 0 points in 4 of 4",
           ZEN4_VM, "2026-12-03", SCRIPT),
    # Shown, not graded: an optimised inference engine vs eager fp32. CPU: ONNX Runtime at
    # level "all" vs eager, deployed_model at batch 1, 32 px (section 4); GPU: the TensorRT FP16
    # engine of ResNet-18 vs eager fp32 (section 7).
    Target(LAB.number, "engine_speedup", "cpu", "speedup", 3.0, 1.15,
           f"{SCRIPT}: 4.81–6.1x, median 4.92 (full, 5 runs)",
           f"{SCRIPT}: eager vs eager 0.899–0.991x, median 0.972 (5 runs)",
           ZEN4_VM, "2026-12-03", SCRIPT),
    Target(LAB.number, "engine_speedup", "cuda", "speedup", 2.0, 1.15,
           "not measured; the claim lab 08 quotes: ResNet-50 on Jetson Xavier 45 → 11 ms "
           "(4.1x), FP16 2x",
           "eager fp32 1.0x", NOT_MEASURED, "2026-12-03"),
)  # fmt: skip


@dataclass(frozen=True)
class Sizes:
    """The lab's problem sizes. The models and images are the same in smoke and full mode (the
    inspection dataset itself is smaller in smoke mode); only the notebook's throughput
    demonstration and the time it spends per measurement shrink."""

    channels: int = 16  # tiny_cnn width: per-layer overhead, not arithmetic, dominates
    image: int = 32  # side of the images the latency checks use (batch 1)
    probe_image: int = 64  # side of the inspection images the precision experiment classifies
    probe_batch: int = 64  # images per call when the precision experiment classifies them
    bf16_batch: int = 16  # (batch, side) the bf16 speed check times: a throughput-sized call
    bf16_image: int = 64
    throughput: tuple[int, int] = (16, 96)  # (batch, side) of the notebook's throughput call
    budget_s: float = 4.0  # seconds per interleaved comparison in the notebook's demonstrations
    run_time_s: float = 0.5  # seconds per single timing in the notebook


def sizes() -> Sizes:
    """The sizes for the current mode (smoke or full)."""
    if is_smoke():
        return Sizes(throughput=(8, 64), budget_s=0.5, run_time_s=0.05)
    return Sizes()


def fast_bf16() -> bool:
    """Whether bf16 is fast here: bf16 hardware (AMX or avx512_bf16) and kernels that use it
    (``hardware.has``; without importing every optional backend as ``hardware.machine()``)."""
    return hardware.has("fast_bf16")


def randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> nn.Module:
    """Give every BatchNorm layer random statistics and affine parameters (in place).

    A freshly built BatchNorm has mean 0, variance 1, weight 1, bias 0: folding it changes
    almost nothing, which would let a wrong fold pass. Returns ``model``.
    """
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.modules.batchnorm._BatchNorm):
                n = module.num_features
                module.running_mean.copy_(torch.randn(n, generator=generator) * 0.5)
                module.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.25)
                if module.affine:
                    module.weight.copy_(torch.rand(n, generator=generator) + 0.5)
                    module.bias.copy_(torch.randn(n, generator=generator) * 0.2)
    return model


def deployed_model(seed: int = 0, channels: int = Sizes.channels) -> nn.Module:
    """The inspection classifier as it would be deployed: ``tiny_cnn`` in eval mode with
    non-trivial BatchNorm statistics, weights drawn from ``seed`` (global RNG untouched)."""
    model = seeds.seeded(lambda: models.tiny_cnn(len(datasets.INSPECTION_CLASSES), channels), seed)
    return randomize_batchnorm(model, seeds.generator(seed + 1)).eval()


def resnet(seed: int = 0) -> nn.Module:
    """A ResNet-18 (``models.image_classifier``) in eval mode with random BatchNorm statistics:
    BatchNorms inside residual blocks and in the downsampling shortcuts."""
    model = seeds.seeded(lambda: models.image_classifier(len(datasets.INSPECTION_CLASSES)), seed)
    return randomize_batchnorm(model, seeds.generator(seed + 1)).eval()


def baseline_fuse_conv_bn(model: nn.Module) -> nn.Module:
    """What exercise 2 starts from: the deployed model as it is, nothing folded (a copy)."""
    return copy.deepcopy(model).eval()


def baseline_to_bf16(model: nn.Module) -> nn.Module:
    """What exercise 4 starts from: the model in float32 (a copy)."""
    return copy.deepcopy(model).eval()


class Bf16Model(nn.Module):
    """A copy of ``inner`` computing in bfloat16; float32 in, float32 out."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = copy.deepcopy(inner).to(torch.bfloat16)

    def forward(self, x: Tensor) -> Tensor:
        return self.inner(x.to(torch.bfloat16)).float()


def reference_to_bf16(model: nn.Module) -> nn.Module:
    """The instructors' ``to_bf16``: the graders time it beside the student's."""
    return Bf16Model(model).eval()


def reference_fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """One conv with ``bn`` (eval mode) folded in: PyTorch's ``fuse_conv_bn_eval``."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    return fuse_conv_bn_eval(copy.deepcopy(conv).eval(), copy.deepcopy(bn).eval())


def reference_fuse(model: nn.Module) -> nn.Module:
    """Every Conv→BatchNorm pair folded, by torch.fx (a new GraphModule; ``model`` unchanged)."""
    from torch.fx.experimental.optimization import fuse

    return fuse(copy.deepcopy(model).eval())


def reference_fuse_conv_bn(model: nn.Module) -> nn.Module:
    """Exercise 2's solution: trace a copy, fold every BatchNorm2d whose input is a Conv2d used
    by nothing else (:func:`reference_fold`), erase the BatchNorm nodes."""
    gm = torch.fx.symbolic_trace(copy.deepcopy(model).eval())
    modules = dict(gm.named_modules())
    for node in list(gm.graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.BatchNorm2d):
            continue
        conv_node = node.args[0]
        if not (
            isinstance(conv_node, torch.fx.Node)
            and conv_node.op == "call_module"
            and isinstance(modules[conv_node.target], nn.Conv2d)
            and len(conv_node.users) == 1
        ):
            continue
        folded = reference_fold(modules[conv_node.target], modules[node.target])
        gm.set_submodule(conv_node.target, folded)
        node.replace_all_uses_with(conv_node)
        gm.graph.erase_node(node)
    gm.delete_all_unused_submodules()
    gm.recompile()
    return gm


def count_batchnorms(model: nn.Module) -> int:
    """How many BatchNorm modules ``model`` still calls (modules reachable from it)."""
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


# ---------------------------------------------------------------------------------------------
# ONNX and ONNX Runtime


def export(model: nn.Module, example: Tensor) -> bytes:
    """``model`` as serialized ONNX, layer for layer as written: torch.export → ONNX (dynamo)
    with the exporter's graph optimiser off (it would already fold BatchNorm into the convs),
    then only constant folding (onnxscript), which removes the shape bookkeeping the
    translation leaves around each conv's bias. Quiet (the exporter prints progress)."""
    from onnxscript.optimizer import fold_constants

    with captured_stderr(), contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(
            copy.deepcopy(model).eval(), (example,), dynamo=True, optimize=False, verbose=False
        )
        fold_constants(program.model)
    return program.model_proto.SerializeToString()


@functools.cache
def exported_deployed(seed: int = 0, side: int = Sizes.image) -> bytes:
    """:func:`export` of ``deployed_model(seed)`` at batch 1, cached per process (~4 s each)."""
    return export(deployed_model(seed), torch.zeros(1, 3, side, side))


def op_counts(graph: Any) -> collections.Counter[str]:
    """How many nodes of each operator type an ONNX graph has (a ModelProto, bytes or path).

    Operators from a non-standard domain are named ``domain.Op`` (e.g.
    ``com.microsoft.nchwc.Conv``, ONNX Runtime's blocked-layout convolution).
    """
    import onnx

    if isinstance(graph, bytes):
        graph = onnx.load_from_string(graph)
    elif isinstance(graph, (str, os.PathLike)):
        graph = onnx.load(os.fspath(graph))
    return collections.Counter(
        f"{node.domain}.{node.op_type}" if node.domain not in ("", "ai.onnx") else node.op_type
        for node in graph.graph.node
    )


def reference_optimized(model: bytes, optimization: str, path: str | os.PathLike[str]) -> Any:
    """The graders' way to make ONNX Runtime write the graph it optimised to ``path``:
    options from :func:`ptcourse.assets.onnx_runtime.options` with ``optimized_model_filepath`` set.
    Returns the session."""
    import onnxruntime as ort

    opts = onnx_runtime.options(threads=1, optimization=optimization)
    opts.optimized_model_filepath = os.fspath(path)
    return ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------------------------------------
# Reduced precision on the inspection images


@torch.enable_grad()
def _fit_head(features: Tensor, labels: Tensor, classes: int) -> nn.Linear:
    """Multinomial logistic regression (L-BFGS, a little L2) on fixed features."""
    head = nn.Linear(features.shape[1], classes)
    opt = torch.optim.LBFGS(head.parameters(), max_iter=200, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(head(features), labels) + 1e-3 * head.weight.pow(2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return head


def _probe(x_train: Tensor, y_train: Tensor) -> nn.Module:
    """A fresh tiny_cnn (global RNG) with BatchNorm calibrated and the head fitted on the images."""
    model = models.tiny_cnn(len(datasets.INSPECTION_CLASSES), Sizes.channels)
    with torch.no_grad():  # calibrate BatchNorm on the training images
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.momentum = None  # cumulative average over the calibration pass
        model.train()(x_train[:256])
    model.eval()
    body = nn.Sequential(*list(model)[:-1])
    with torch.no_grad():
        features = body(x_train)
    mean, std = features.mean(0), features.std(0) + 1e-6
    head = _fit_head((features - mean) / std, y_train, len(datasets.INSPECTION_CLASSES))
    with torch.no_grad():  # fold the feature standardisation into the head
        last = model[-1]
        last.weight.copy_(head.weight / std)
        last.bias.copy_(head.bias - (head.weight * mean / std).sum(1))
    return model


@functools.cache
@torch.inference_mode(False)
def _inspection_model(seed: int, smoke: bool) -> nn.Module:
    x_train, y_train, _, _ = datasets.inspection_tensors(Sizes.probe_image, "channel", smoke)
    return seeds.seeded(lambda: _probe(x_train, y_train), seed)


def inspection_model(seed: int = 0) -> nn.Module:
    """A tiny_cnn classifier for the inspection images at ``probe_image`` px, eval mode.

    Its convolutions keep their random initial weights and BatchNorm statistics calibrated on
    the training images; only the linear head is fitted (logistic regression on the pooled
    features, a "linear probe"). It is a weak classifier — near chance: 24–32% on 4 classes at
    full size — but its predictions are real, which is all the precision experiment needs.
    Training the whole network to a good accuracy takes far longer than this lab has. A fresh
    copy each call (fitted once per seed and dataset size)."""
    return copy.deepcopy(_inspection_model(seed, is_smoke()))


@dataclass(frozen=True)
class PrecisionChange:
    """How a reduced-precision model's predictions differ from the fp32 model's."""

    accuracy_fp32: float
    accuracy_low: float
    flipped: float  # fraction of images whose predicted class changed
    relative_error: float  # ||logits_low - logits_fp32|| / ||logits_fp32||
    images: int
    output_dtype: torch.dtype

    @property
    def accuracy_drop(self) -> float:
        return self.accuracy_fp32 - self.accuracy_low

    def summary(self) -> str:
        return (
            f"accuracy {self.accuracy_fp32:.3f} (fp32) → {self.accuracy_low:.3f} "
            f"(change {-self.accuracy_drop:+.3f}); predictions changed on "
            f"{self.flipped:.2%} of {self.images} images; logits differ by "
            f"{self.relative_error:.2%} (relative); output dtype {self.output_dtype}"
        )


@torch.no_grad()
def precision_change(
    convert: Callable[[nn.Module], nn.Module], seed: int = 0, batch: int = Sizes.probe_batch
) -> PrecisionChange:
    """Run :func:`inspection_model` in fp32 and as ``convert(copy)`` on the inspection test
    images (``probe_image`` px, standardised per channel with the training split's statistics)."""
    _, _, x_test, y_test = datasets.inspection_tensors(Sizes.probe_image, "channel")
    model = inspection_model(seed)
    low = convert(copy.deepcopy(model))
    ref = torch.cat([model(x_test[i : i + batch]) for i in range(0, len(x_test), batch)])
    out = torch.cat([low(x_test[i : i + batch]) for i in range(0, len(x_test), batch)])
    return PrecisionChange(
        accuracy_fp32=(ref.argmax(1) == y_test).float().mean().item(),
        accuracy_low=(out.argmax(1) == y_test).float().mean().item(),
        flipped=(ref.argmax(1) != out.argmax(1)).float().mean().item(),
        relative_error=numerics.relative_error(out, ref),
        images=len(x_test),
        output_dtype=out.dtype,
    )


def conv_output_dtypes(model: nn.Module, example: Tensor) -> list[torch.dtype]:
    """The dtype each Conv2d/Linear in ``model`` produced during one call on ``example``."""
    seen: list[torch.dtype] = []
    hooks = [
        m.register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
        for m in model.modules()
        if isinstance(m, (nn.Conv2d, nn.Linear))
    ]
    try:
        with torch.inference_mode():
            model(example)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def low_precision_share(model: nn.Module, example: Tensor) -> float:
    """Fraction of Conv2d/Linear outputs that were bf16 or fp16 (0.0 when none ran)."""
    seen = conv_output_dtypes(model, example)
    low = sum(dtype in (torch.bfloat16, torch.float16) for dtype in seen)
    return low / len(seen) if seen else 0.0


# ---------------------------------------------------------------------------------------------
# The GPU track: TensorRT and Torch-TensorRT (imported lazily; run only where both CUDA and
# TensorRT exist — neither can be installed on a CPU-only machine)


def export_dynamic_batch(model: nn.Module, side: int, max_batch: int = 16) -> bytes:
    """``model`` as ONNX with a dynamic batch dimension (1..max_batch), for TensorRT's
    optimisation profile. The exporter's own optimiser stays on: TensorRT fuses anyway."""
    batch = torch.export.Dim("batch", min=1, max=max_batch)
    with captured_stderr(), contextlib.redirect_stdout(io.StringIO()):
        program = torch.onnx.export(
            copy.deepcopy(model).eval().cpu(),
            (torch.zeros(2, 3, side, side),),
            dynamo=True,
            dynamic_shapes=({0: batch},),
            verbose=False,
        )
    return program.model_proto.SerializeToString()


def tensorrt_engine(
    onnx_model: bytes,
    side: int,
    *,
    fp16: bool = True,
    batches: tuple[int, int, int] = (1, 8, 16),
    workspace_bytes: int = 1 << 30,
) -> bytes:
    """Build a serialized TensorRT engine from ONNX: the builder config of a deployment recipe.

    FP16 kernels allowed (``BuilderFlag.FP16``), a workspace limit for the tactics the builder
    times (``MemoryPoolType.WORKSPACE``), and one optimisation profile for the batch
    dimension: (min, opt, max) = ``batches`` — kernels are auto-tuned for the "opt" shape and
    valid from min to max. Layer fusion (Conv+BN+ReLU and more) happens inside the build.
    """
    import tensorrt as trt

    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(0)  # explicit batch: the only mode in TensorRT 10
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_model):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse the ONNX model: {errors}")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    if fp16:
        config.set_flag(trt.BuilderFlag.FP16)
    profile = builder.create_optimization_profile()
    name = network.get_input(0).name
    low, opt, high = ((b, 3, side, side) for b in batches)
    profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError("TensorRT failed to build the engine (see its log above)")
    return bytes(engine)


class TensorRTModule:
    """Run a serialized TensorRT engine on CUDA torch tensors: ``module(x) -> logits``."""

    def __init__(self, serialized: bytes) -> None:
        import tensorrt as trt

        self._trt = trt
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(serialized)
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input = next(n for n in names if self.engine.get_tensor_mode(n) == mode)
        self.output = next(n for n in names if self.engine.get_tensor_mode(n) != mode)

    def __call__(self, x: Tensor) -> Tensor:
        x = x.contiguous().float()
        self.context.set_input_shape(self.input, tuple(x.shape))
        out = torch.empty(
            tuple(self.context.get_tensor_shape(self.output)), device=x.device, dtype=torch.float32
        )
        self.context.set_tensor_address(self.input, x.data_ptr())
        self.context.set_tensor_address(self.output, out.data_ptr())
        stream = torch.cuda.current_stream()
        if not self.context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError("TensorRT execution failed")
        return out


def torch_tensorrt_module(
    model: nn.Module, side: int, batches: tuple[int, int, int] = (1, 8, 16)
) -> Any:
    """The same engine through Torch-TensorRT (dynamo path): FP16 allowed, batch profile."""
    import torch_tensorrt

    low, opt, high = ((b, 3, side, side) for b in batches)
    spec = torch_tensorrt.Input(min_shape=low, opt_shape=opt, max_shape=high, dtype=torch.float32)
    return torch_tensorrt.compile(
        copy.deepcopy(model).eval().cuda(),
        ir="dynamo",
        inputs=[spec],
        enabled_precisions={torch.float16},
    )


# ---------------------------------------------------------------------------------------------
# The checks: one per hidden test cell


def _fold_cases() -> list[nn.Conv2d]:
    """The convs check_fold folds: with and without bias, strided, grouped, 1x1 (global RNG)."""
    return [
        nn.Conv2d(3, 16, 3, padding=1, bias=False),
        nn.Conv2d(16, 8, 3, stride=2, padding=1, bias=True),
        nn.Conv2d(8, 8, 3, padding=1, groups=8, bias=False),
        nn.Conv2d(8, 12, 1, bias=True),
    ]


Fold = Callable[[nn.Conv2d, nn.BatchNorm2d], nn.Conv2d]


def check_fold(fold_bn: Fold, *, points: float) -> float:
    """``fold_bn`` on fresh convs and BatchNorms (secret seed) equals ``reference_fold``."""
    seed = checks.secret_seed()
    gen = seeds.generator(seed)
    convs = seeds.seeded(_fold_cases, seed)
    for conv in convs:
        bn = randomize_batchnorm(nn.BatchNorm2d(conv.out_channels), gen).eval()
        xs = torch.randn(3, conv.in_channels, 10, 10, generator=gen)
        with torch.no_grad():
            want = reference_fold(conv, bn)(xs)
            with captured_stderr():
                got = fold_bn(conv, bn)(xs)
        checks.check_close(got, want, atol=1e-5, rtol=1e-4, what=f"fold_bn({conv})")
    print(f"fold_bn matches torch.nn.utils.fusion.fuse_conv_bn_eval on {len(convs)} fresh convs")
    return float(points)


def batchnorms_of(_answer: Any, model: nn.Module) -> int:
    """:func:`count_batchnorms` of ``model`` where the answer lives (``checks.beside``): in the
    judge, of the worker's copy of a model the answer was given, whose structure the judge's
    copy does not follow."""
    return count_batchnorms(model)


def _fused_equal(fuse_conv_bn: Callable[[nn.Module], nn.Module], name: str, net: nn.Module,
                 xs: Tensor) -> int:  # fmt: skip
    """Check one fused model (outputs equal, no BatchNorm left, ``net`` unchanged); return how
    many BatchNorms ``net`` has."""
    bns = count_batchnorms(net)
    with torch.inference_mode():
        want = net(xs)
        with captured_stderr():
            fused_net = fuse_conv_bn(net)
            got = fused_net(xs)
        again = net(xs)  # in the judge: with the state the call left in its copy of net
    kept = checks.beside(fuse_conv_bn, batchnorms_of, net)
    if kept != bns or not torch.equal(again, want):
        raise checks.CheckFailed(f"{name}: fuse_conv_bn changed the model it was given")
    left = checks.beside(fused_net, count_batchnorms)
    if left:
        raise checks.CheckFailed(f"{name}: {left} of {bns} BatchNorm modules are left")
    scale = want.abs().max().item()
    checks.check_close(got, want, atol=1e-4 * scale, rtol=1e-4, what=f"{name} logits")
    return bns


def check_fuse(fuse_conv_bn: Callable[[nn.Module], nn.Module], *, points: float) -> float:
    """``fuse_conv_bn`` keeps the outputs of a fresh tiny CNN and a ResNet-18 and folds every
    BatchNorm, without changing the model it is given."""
    seed = checks.secret_seed()
    gen = seeds.generator(seed)
    for name, net in [("tiny CNN", deployed_model(seed)), ("ResNet-18", resnet(seed))]:
        xs = torch.randn(2, 3, 32, 32, generator=gen)
        bns = _fused_equal(fuse_conv_bn, name, net, xs)
        print(f"{name}: {bns} BatchNorms folded, outputs equal")
    return float(points)


def fusion_speed_case(seed: int) -> tuple[nn.Module, Tensor]:
    """The deployed model and the batch-1 image check_fusion_speed times (from ``seed``)."""
    side = sizes().image
    return deployed_model(seed + 7), torch.randn(1, 3, side, side, generator=seeds.generator(seed))


def grade_fusion_latency(net: nn.Module, fused_net: nn.Module, xs: Tensor, *,
                         points: float) -> float:  # fmt: skip
    """Points for the batch-1 latency of ``fused_net`` against ``net`` as it was (the baseline),
    relative to :func:`reference_fuse_conv_bn` timed in the same interleaved run, one thread
    (row ``fusion_latency``), every call on a fresh image shaped like ``xs`` (in the judge the
    baseline and the reference run in a trusted twin of the answer's worker); where the
    reference does not clear the floor here, the points grade that the BatchNorms are folded
    (:func:`grade_bn_folded`)."""
    base, ref = baseline_fuse_conv_bn(net), reference_fuse_conv_bn(net)
    fresh = fresh_like(xs)

    def verify(args: tuple[Tensor], out: Any) -> None:
        with torch.inference_mode():
            want = net(*args)
        checks.check_close(out, want, atol=1e-4, rtol=1e-4, what="fused logits of a timed call")

    def folded(reason: str) -> float:
        print("So these points grade that your fused model has its BatchNorms folded instead.")
        return grade_bn_folded(net, fused_net, xs, points=points)

    goal = targets.goal(TARGETS, "fusion_latency")
    with torch.inference_mode():  # for the calls made here (the judge's run in its workers)
        return checks.speed_check(
            goal,
            fused_net,
            fresh=fresh,
            verify=verify,
            baseline=base,
            reference=ref,
            inference=True,
            points=points,
            not_gradable=folded,
        )


def fresh_like(xs: Tensor) -> Callable[[], tuple[Tensor]]:
    """A new random input shaped like ``xs`` at every call, from the secret seed (what the
    judge times: the answer never sees an input twice)."""
    gen = seeds.generator(checks.secret_seed() + 1)
    return lambda: (torch.randn(xs.shape, generator=gen),)


def folded_share(net: nn.Module, fused_net: Callable[[Tensor], Any], xs: Tensor) -> float:
    """How many of ``net``'s BatchNorms ``fused_net`` has folded away, 0..1: the smaller of the
    share of batch-norm operator calls gone and the operator calls saved per BatchNorm. A
    BatchNorm kept under another module name still calls batch_norm; one kept as elementwise
    arithmetic saves no calls: both score 0. The fused model's operators are counted where it
    runs (``checks.beside``: in the judge, what its worker reports)."""
    before = measure.aten_call_counts(net, xs)
    after = checks.beside(fused_net, measure.aten_call_counts, xs)
    bns = sum(n for op, n in before.items() if "batch_norm" in op)
    left = sum(n for op, n in after.items() if "batch_norm" in op)
    saved = sum(before.values()) - sum(after.values())
    print(
        f"one call runs {sum(before.values())} aten operators in the original ({bns} batch-norm) "
        f"and {sum(after.values())} in your fused model ({left} batch-norm)"
    )
    return max(0.0, min(1.0, 1.0 - left / bns, saved / bns))


def grade_bn_folded(net: nn.Module, fused_net: nn.Module, xs: Tensor, *, points: float) -> float:
    """Points for :func:`folded_share` of ``fused_net`` (row ``bn_folded``)."""
    goal = targets.goal(TARGETS, "bn_folded")
    return checks.value(goal, lambda: folded_share(net, fused_net, xs), points=points)


def check_fusion_speed(fuse_conv_bn: Callable[[nn.Module], nn.Module], *, points: float) -> float:
    """Batch-1 latency of the fused tiny CNN against the original (fresh weights and input),
    relative to the reference fusion timed in the same run, one thread; the fused model must
    compute the same and hold no BatchNorm. Where the reference's speedup does not clear the
    floor here, the points grade that the BatchNorms are folded."""
    net, xs = fusion_speed_case(checks.secret_seed())
    with torch.inference_mode():
        want = net(xs)
        with captured_stderr():
            fused_net = fuse_conv_bn(net)
            got = fused_net(xs)
    checks.check_close(got, want, atol=1e-4, rtol=1e-4, what="fused logits")
    if checks.beside(fused_net, count_batchnorms):
        raise checks.CheckFailed("BatchNorm modules are left: nothing folded")
    if folded_share(net, fused_net, xs) <= 0:
        # BatchNorm's arithmetic kept under another name saves only Python overhead: 1.11x
        # (CI 1.08-1.16) measured, at this check's 1.1x floor, so it is not timed at all.
        raise checks.CheckFailed("every batch-norm still runs (see above): nothing folded")
    return grade_fusion_latency(net, fused_net, xs, points=points)


def optimized_graph(model: bytes, optimization: str) -> collections.Counter[str]:
    """Operator counts of the graph ONNX Runtime runs for ``model`` at ``optimization``."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "optimized.onnx")
        reference_optimized(model, optimization, path)
        return op_counts(path)


def check_ort(optimized_session: Callable[[bytes, str, str], Any], *, points: float) -> float:
    """``optimized_session`` writes the graph ONNX Runtime optimised at "basic" and "all" (the
    same graph the reference writes) and computes the model. The session and the file live
    where the answer runs (in the judge: its worker); the graph comes back as bytes and is
    compared here, and so are the logits."""
    side = sizes().image
    onnx_bytes = exported_deployed(0, side)
    net = deployed_model(0)
    xs = torch.randn(1, 3, side, side, generator=checks.secret_generator())
    with torch.inference_mode():
        want = net(xs)
    for level in ("basic", "all"):
        sess, graph = checks.beside(optimized_session, session_and_graph, onnx_bytes, level)
        if graph is None:
            raise checks.CheckFailed(f"{level}: no optimised graph written to the given path")
        got, expected = op_counts(graph), optimized_graph(onnx_bytes, level)
        if got != expected:
            raise checks.CheckFailed(f"{level}: graph {dict(got)}, expected {dict(expected)}")
        logits = checks.beside(sess, onnx_runtime.run, xs)
        checks.check_close(logits, want, atol=1e-4, rtol=1e-4, what=f"ORT ({level}) logits")
    print("optimised graphs written at 'basic' and 'all'; outputs equal PyTorch's")
    return float(points)


def session_and_graph(
    optimized_session: Callable[[bytes, str, str], Any], onnx_model: bytes, optimization: str
) -> tuple[Any, bytes | None]:
    """``optimized_session(onnx_model, optimization, path)`` with a fresh ``path`` where the
    answer runs (``checks.beside``); the session, and the bytes of the file it wrote to
    ``path`` (None if it wrote none)."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "optimized.onnx")
        with captured_stderr():
            session = optimized_session(onnx_model, optimization, path)
        written = Path(path).read_bytes() if os.path.isfile(path) else None
    return session, written


BF16_ERROR = 0.2  # relative error of bf16 logits beyond which the model is converted wrong


def check_bf16_accuracy(to_bf16: Callable[[nn.Module], nn.Module], *, points: float) -> float:
    """|accuracy change| of ``to_bf16`` on the inspection test images (a fresh classifier)."""
    with captured_stderr():
        change = precision_change(to_bf16, seed=checks.secret_seed() % 1000)
    print(change.summary())
    if change.output_dtype != torch.float32:
        raise checks.CheckFailed("to_bf16 must return float32 logits")
    if not change.relative_error < BF16_ERROR:
        raise checks.CheckFailed("bf16 logits are far from fp32's: is the model converted right?")
    goal = targets.goal(TARGETS, "bf16_accuracy_change")
    return checks.value(goal, lambda: abs(change.accuracy_drop), points=points)


def grade_bf16_speed(net: nn.Module, low_net: nn.Module, seed: int, *, points: float) -> float:
    """Points for the speed of ``low_net`` over ``net`` in fp32 (the baseline) at a
    throughput-sized batch, interleaved, one thread (row ``bf16_speed``), relative to
    :func:`reference_to_bf16` timed in the same run, every call on fresh images (in the judge
    the baseline and the reference run in a trusted twin of the answer's worker). Where even
    the reference does not clear the floor here (bf16 matmuls fast, but other kernels not:
    ``ATEN_CPU_CAPABILITY=default`` measured 0.65x), the points grade bf16 in effect instead."""
    size = sizes()
    fresh = fresh_like(torch.empty(size.bf16_batch, 3, size.bf16_image, size.bf16_image))
    fp32, ref = baseline_to_bf16(net), reference_to_bf16(net)

    def verify(args: tuple[Tensor], out: Any) -> None:
        with torch.inference_mode():
            want = net(*args)
        _near_fp32(out, want, "logits of a timed call")

    with torch.inference_mode():  # for the calls made here (the judge's run in its workers)
        return checks.speed_check(
            targets.goal(TARGETS, "bf16_speed"),
            low_net,
            fresh=fresh,
            verify=verify,
            baseline=fp32,
            reference=ref,
            inference=True,
            points=points,
            not_gradable=lambda reason: grade_bf16_in_effect(low_net, seed, points=points),
        )


def _near_fp32(out: Any, want: Tensor, what: str) -> None:
    """float32 logits of ``want``'s shape within :data:`BF16_ERROR` (relative) of fp32's."""
    if not isinstance(out, Tensor) or out.dtype != torch.float32 or out.shape != want.shape:
        seen = f"{out.dtype} {tuple(out.shape)}" if isinstance(out, Tensor) else type(out).__name__
        raise checks.CheckFailed(f"{what}: {seen}, expected float32 {tuple(want.shape)}")
    error = numerics.relative_error(out, want)
    if not error < BF16_ERROR:
        raise checks.CheckFailed(f"{what}: {error:.2%} from fp32's (relative)")


def grade_bf16_in_effect(low_net: nn.Module, seed: int, *, points: float) -> float:
    """Points for the share of conv and linear outputs ``low_net`` computes in bf16 (row
    ``bf16_in_effect``: where bf16 has no hardware, its speed says nothing), read where the
    model runs (``checks.beside``: in the judge, what its worker reports)."""
    side = sizes().image
    xs = torch.randn(1, 3, side, side, generator=seeds.generator(seed))
    goal = targets.goal(TARGETS, "bf16_in_effect")
    share = checks.beside(low_net, low_precision_share, xs)
    return checks.value(goal, lambda: share, points=points)


def check_bf16_speed(to_bf16: Callable[[nn.Module], nn.Module], *, points: float) -> float:
    """On a CPU with bf16 hardware: the speedup of ``to_bf16``'s model over fp32 at a
    throughput-sized batch. Elsewhere: that every conv and the head compute in bf16."""
    seed = checks.secret_seed()
    net = deployed_model(seed)
    with captured_stderr():
        low_net = to_bf16(net)
    if fast_bf16():
        return grade_bf16_speed(net, low_net, seed, points=points)
    print("bf16 is not fast here: grading that the convs and the head compute in bf16")
    return grade_bf16_in_effect(low_net, seed, points=points)
