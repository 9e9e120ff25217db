"""ONNX Runtime sessions that behave well next to PyTorch in one process.

Labs that time ONNX Runtime against eager PyTorch (07 export, 08 TensorRT, 10 quantization)
build their sessions here, so every one of them gets the same settings:

- worker-thread **spinning off** (``session.intra_op.allow_spinning = "0"``, same for inter-op):
  spinning ORT threads keep burning a core after each run and slow torch, timed alternately in
  the same process, many times over;
- ``threads`` intra-op threads (1 by default: graded timing is single-threaded) and one
  inter-op thread, sequential execution;
- a named graph-optimization level, so "what does ORT's optimizer buy" is one argument.

:func:`run` feeds a torch tensor (or several) and returns torch tensors, so graders can compare
ORT with eager PyTorch using ordinary ``torch`` code.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
import torch

Optimization = Literal["disabled", "basic", "extended", "all"]
OPTIMIZATIONS: tuple[str, ...] = ("disabled", "basic", "extended", "all")
# a path, serialized bytes, an onnx.ModelProto or a torch.onnx.ONNXProgram
Model = str | os.PathLike[str] | bytes | Any


def available() -> bool:
    """Whether ``onnxruntime`` imports here."""
    try:
        import onnxruntime  # noqa: F401
    except Exception:
        return False
    return True


def providers() -> list[str]:
    """ONNX Runtime execution providers this install offers ([] without onnxruntime)."""
    if not available():
        return []
    import onnxruntime as ort

    return list(ort.get_available_providers())


def has_cuda() -> bool:
    """Whether the CUDA execution provider is installed *and* a CUDA device is visible."""
    return "CUDAExecutionProvider" in providers() and torch.cuda.is_available()


def _as_bytes_or_path(model: Model) -> str | bytes:
    if isinstance(model, bytes):
        return model
    if isinstance(model, (str, os.PathLike)):
        return os.fspath(model)
    proto = getattr(model, "model_proto", model)  # torch.onnx.ONNXProgram -> onnx.ModelProto
    if hasattr(proto, "SerializeToString"):
        return proto.SerializeToString()
    raise TypeError(f"expected a path, bytes, onnx.ModelProto or ONNXProgram, got {type(model)}")


def options(threads: int = 1, optimization: Optimization = "all") -> Any:
    """``ort.SessionOptions`` with spinning off, ``threads`` intra-op threads, sequential mode."""
    import onnxruntime as ort

    if optimization not in OPTIMIZATIONS:
        raise ValueError(f"optimization must be one of {OPTIMIZATIONS}, got {optimization!r}")
    level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[optimization]
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = level
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "0")
    opts.log_severity_level = 3  # errors only: warnings go to stderr and would zero a test cell
    return opts


def session(
    model: Model,
    threads: int = 1,
    optimization: Optimization = "all",
    device: str = "cpu",
) -> Any:
    """An ``ort.InferenceSession`` for ``model`` (path, bytes, ModelProto or ONNXProgram).

    ``device="cuda"`` uses the CUDA execution provider (with CPU fallback for unsupported
    nodes) and raises ``RuntimeError`` where it is not installed; ``"cpu"`` uses only the CPU
    provider.
    """
    import onnxruntime as ort

    if device == "cuda":
        if "CUDAExecutionProvider" not in providers():
            raise RuntimeError(
                "onnxruntime has no CUDAExecutionProvider here (install onnxruntime-gpu)"
            )
        chosen = ["CUDAExecutionProvider", "CPUExecutionProvider"]
    elif device == "cpu":
        chosen = ["CPUExecutionProvider"]
    else:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    return ort.InferenceSession(
        _as_bytes_or_path(model), sess_options=options(threads, optimization), providers=chosen
    )


def _to_numpy(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().contiguous().numpy()


def run_all(sess: Any, *inputs: torch.Tensor) -> list[torch.Tensor]:
    """Run ``sess`` on torch tensors (fed in the model's input order); every output as torch."""
    names = [i.name for i in sess.get_inputs()]
    if len(inputs) != len(names):
        raise ValueError(f"model takes {len(names)} inputs {names}, got {len(inputs)}")
    feeds = {name: _to_numpy(x) for name, x in zip(names, inputs, strict=True)}
    return [torch.from_numpy(np.asarray(out)) for out in sess.run(None, feeds)]


def run(sess: Any, *inputs: torch.Tensor) -> torch.Tensor:
    """Run ``sess`` on torch tensor(s) and return its first output as a CPU torch tensor."""
    return run_all(sess, *inputs)[0]


def input_names(sess: Any) -> Sequence[str]:
    """The model's input names, in order."""
    return [i.name for i in sess.get_inputs()]


def settings(sess: Any) -> dict[str, Any]:
    """What ``sess`` runs with, read back from ONNX Runtime: intra- and inter-op threads (0 means
    one per core), whether independent operators run side by side (parallel execution mode, the
    only one that uses inter-op threads), whether each pool's threads spin (ORT's default) or
    sleep, the graph optimization level and the providers in order of preference."""
    opts = sess.get_session_options()

    def spins(pool: str) -> bool:
        try:
            return opts.get_session_config_entry(f"session.{pool}.allow_spinning") != "0"
        except Exception:  # never set: ORT's default, spinning on
            return True

    level = str(opts.graph_optimization_level).rsplit(".", 1)[-1]  # e.g. ORT_ENABLE_ALL
    return {
        "intra_op_threads": opts.intra_op_num_threads,
        "parallel_operators": str(opts.execution_mode).endswith("ORT_PARALLEL"),
        "inter_op_threads": opts.inter_op_num_threads,
        "intra_op_spinning": spins("intra_op"),
        "inter_op_spinning": spins("inter_op"),
        "optimization": level,
        "providers": list(sess.get_providers()),
    }
