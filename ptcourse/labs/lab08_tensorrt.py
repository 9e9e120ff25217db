"""Lab 08, TensorRT's ideas on a CPU: layer fusion, graph optimisation, reduced precision.

- :func:`deployed_model` is the lab's inspection classifier in eval mode: ``models.tiny_cnn``
  (Conv+BN+ReLU blocks) whose BatchNorm layers hold realistic, non-trivial statistics, so
  folding them into the convs changes every weight.
- :func:`reference_fold` and :func:`reference_fuse` are the graders' references: PyTorch's own
  ``fuse_conv_bn_eval`` and the torch.fx pass ``torch.fx.experimental.optimization.fuse``.
- :func:`export` and :func:`optimized_graph` turn a model into ONNX and read back the graph
  ONNX Runtime actually runs at each optimisation level (sessions from
  :mod:`ptcourse.assets.onnx_runtime`).
- :func:`inspection_model` is a classifier with a head fitted on the inspection images, for the
  precision experiment: how many predictions (and how much accuracy) bf16 changes.
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
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ptcourse.assets import datasets, models, onnx_runtime
from ptcourse.core import hardware
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import is_smoke
from ptcourse.grading.targets import CPU_VM, Target

LAB = "08"
CHANNELS = 16  # tiny_cnn width: small enough that per-layer overhead, not arithmetic, dominates
IMAGE = 32  # side of the images the latency checks use (batch 1)
PROBE_IMAGE = 64  # side of the inspection images the precision experiment classifies


def fast_bf16() -> bool:
    """Whether this CPU has bf16 hardware (AMX or avx512_bf16): reads the CPU flags only,
    without importing every optional backend as ``hardware.machine()`` does (seconds)."""
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


def deployed_model(seed: int = 0, channels: int = CHANNELS) -> nn.Module:
    """The inspection classifier as it would be deployed: ``tiny_cnn`` in eval mode with
    non-trivial BatchNorm statistics, weights drawn from ``seed`` (global RNG untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = models.tiny_cnn(len(datasets.INSPECTION_CLASSES), channels)
    return randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1)).eval()


def resnet(seed: int = 0) -> nn.Module:
    """A ResNet-18 (``models.image_classifier``) in eval mode with random BatchNorm statistics:
    BatchNorms inside residual blocks and in the downsampling shortcuts."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = models.image_classifier(len(datasets.INSPECTION_CLASSES))
    return randomize_batchnorm(model, torch.Generator().manual_seed(seed + 1)).eval()


def reference_fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> nn.Conv2d:
    """One conv with ``bn`` (eval mode) folded in: PyTorch's ``fuse_conv_bn_eval``."""
    from torch.nn.utils.fusion import fuse_conv_bn_eval

    return fuse_conv_bn_eval(copy.deepcopy(conv).eval(), copy.deepcopy(bn).eval())


def reference_fuse(model: nn.Module) -> nn.Module:
    """Every Conv→BatchNorm pair folded, by torch.fx (a new GraphModule; ``model`` unchanged)."""
    from torch.fx.experimental.optimization import fuse

    return fuse(copy.deepcopy(model).eval())


def count_batchnorms(model: nn.Module) -> int:
    """How many BatchNorm modules ``model`` still calls (modules reachable from it)."""
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules())


def max_difference(a: Tensor, b: Tensor) -> float:
    """Largest absolute difference between two tensors, in float64."""
    return (a.double() - b.double()).abs().max().item()


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
def exported_deployed(seed: int = 0, side: int = IMAGE) -> bytes:
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


def optimized_graph(model: bytes, optimization: str) -> collections.Counter[str]:
    """Operator counts of the graph ONNX Runtime runs for ``model`` at ``optimization``."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "optimized.onnx")
        reference_optimized(model, optimization, path)
        return op_counts(path)


# ---------------------------------------------------------------------------------------------
# Reduced precision on the inspection images


@functools.cache
@torch.inference_mode(False)
def _inspection_tensors(smoke: bool, side: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    from ptcourse.assets import loaders

    train, test = datasets.inspection_splits(smoke)

    def load(files: list[tuple[Any, int]]) -> tuple[Tensor, Tensor]:
        pixels = torch.stack([loaders.decode(path) for path, _ in files]).float() / 255
        images = F.interpolate(pixels, size=(side, side), mode="bilinear", antialias=True)
        return images, torch.tensor([label for _, label in files])

    x_train, y_train = load(train)
    x_test, y_test = load(test)
    mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
    std = x_train.std(dim=(0, 2, 3), keepdim=True)
    return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test


def inspection_tensors(side: int = PROBE_IMAGE) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Normalised inspection images at ``side`` x ``side``: (x_train, y_train, x_test, y_test),
    smoke-size dataset in smoke mode. Decoded once per process."""
    return _inspection_tensors(is_smoke(), side)


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


@functools.cache
@torch.inference_mode(False)
def _inspection_model(seed: int, smoke: bool) -> nn.Module:
    x_train, y_train, _, _ = _inspection_tensors(smoke, PROBE_IMAGE)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = models.tiny_cnn(len(datasets.INSPECTION_CLASSES), CHANNELS)
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


def inspection_model(seed: int = 0) -> nn.Module:
    """A tiny_cnn classifier for the inspection images at ``PROBE_IMAGE`` px, eval mode.

    Its convolutions keep their random initial weights and BatchNorm statistics calibrated on
    the training images; only the linear head is fitted (logistic regression on the pooled
    features, a "linear probe"). It is a weak classifier — a little above chance — but a real
    one, which is all the precision experiment needs. Training the whole network to a good
    accuracy takes far longer than this lab has. A fresh copy each call (fitted once).
    """
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
    convert: Callable[[nn.Module], nn.Module], seed: int = 0, batch: int = 64
) -> PrecisionChange:
    """Run :func:`inspection_model` in fp32 and as ``convert(copy)`` on the test images."""
    _, _, x_test, y_test = inspection_tensors()
    model = inspection_model(seed)
    low = convert(copy.deepcopy(model))
    ref = torch.cat([model(x_test[i : i + batch]) for i in range(0, len(x_test), batch)])
    out = torch.cat([low(x_test[i : i + batch]) for i in range(0, len(x_test), batch)])
    return PrecisionChange(
        accuracy_fp32=(ref.argmax(1) == y_test).float().mean().item(),
        accuracy_low=(out.argmax(1) == y_test).float().mean().item(),
        flipped=(ref.argmax(1) != out.argmax(1)).float().mean().item(),
        relative_error=((out.double() - ref.double()).norm() / ref.double().norm()).item(),
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


def torch_tensorrt_module(model: nn.Module, side: int, batches=(1, 8, 16)) -> Any:
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


# Lab 08: filled from that lab's measurements.
LAB08_RUNS = "hidden-test code, 12 runs full + 12 smoke"
LAB08_NOT_MEASURED = "NOT measured (no GPU, no AMX/avx512_bf16 when this lab was written)"
TARGETS: tuple[Target, ...] = (
    # Batch-1 latency of deployed_model (tiny_cnn 16 ch, 32x32) with BatchNorm folded (torch.fx
    # GraphModule) vs the original, eager, 1 thread. Same sizes in smoke and full.
    Target("08", "fusion_latency", "cpu", "speedup", 1.2, 1.1,
           "1.267–1.318x, median 1.284 (full); 1.274–1.350x, median 1.29 (smoke); "
           "nbgrader autograde (smoke) 1.27–1.31x in 20 runs; fx-traced but unfolded 0.90–0.97x",
           "unfused copy 0.98–1.05x (24 runs)", f"{CPU_VM}; {LAB08_RUNS}", "2026-12-03"),
    # |accuracy(bf16) − accuracy(fp32)| of fusion.inspection_model (head fitted on features,
    # ~30–40% on 4 classes) on the inspection test split: 64 images smoke, 480 full.
    Target("08", "bf16_accuracy_change", "cpu", "accuracy_drop", 0.05, 0.15,
           "|change| 0–0.031 (smoke, flips ≤ 6.3%), 0–0.0104 (full, flips ≤ 3.3%); logits "
           "2–5% relative; 12 seeds each; autograde 0–0.031 in 20 runs",
           "fp32 copy: 0 (this check is not a speed check)", f"{CPU_VM}; {LAB08_RUNS}",
           "2026-12-03"),
    # Where bf16 is slow (no AMX/avx512_bf16) the speed cell grades instead that every
    # Conv2d/Linear output is bf16 (fusion.low_precision_share).
    Target("08", "bf16_in_effect", "cpu", "score", 1.0, 0.0,
           "1.0 in 20 of 20 autogrades (smoke) and every notebook run",
           "fp32 copy 0.0 (autograde)", CPU_VM, "2026-12-03"),
    Target("08", "bf16_speed", "cpu", "speedup", 1.3, 1.15,
           "not measured; a course author's bf16 autocast ResNet-18 training step ran 2.4x on Sapphire Rapids "
           "(AMX); here (AVX2) bf16 ran 0.22x of fp32, so this row is never used here",
           "fp32 copy ≈ 1.0x expected", LAB08_NOT_MEASURED, "2026-12-03"),
    # Shown, not graded: an optimised inference engine vs eager fp32. CPU: ONNX Runtime at
    # level "all" vs eager, deployed_model at batch 1, 32 px (section 4); GPU: the TensorRT FP16
    # engine of ResNet-18 vs eager fp32 (section 7).
    Target("08", "engine_speedup", "cpu", "speedup", 3.0, 1.15,
           "5.00–5.14x, median 5.05 (smoke, 10 runs); 5.00–5.09x, median 5.04 (full, 10 runs)",
           "eager vs eager 1.0x", CPU_VM, "2026-12-03"),
    Target("08", "engine_speedup", "cuda", "speedup", 2.0, 1.15,
           "not measured; the claim lab 08 quotes: ResNet-50 on Jetson Xavier 45 → 11 ms (4.1x), FP16 2x",
           "eager fp32 1.0x", LAB08_NOT_MEASURED, "2026-12-03"),
)  # fmt: skip
