"""Lab 06, attention from naive to flash: inputs, the graders' reference, a trace of which kernels
ran (and the biggest tensor they made), the graded problem sizes, the length sweep, the GPU
backend table, and the graders' checks.

The baseline is :func:`ptcourse.assets.models.naive_attention` (the text classifier's "naive"
attention): :func:`baseline_attention` only wraps it, and the speed and memory checks time a
student's ``attention_sdpa`` against it.

- :func:`trace` runs a callable under a ``TorchDispatchMode`` and records every ATen op and the
  largest tensor any op produced: it shows which SDPA kernel ran (on CPU
  ``_scaled_dot_product_flash_attention_for_cpu``) and whether an (L, L) score matrix was made.
- :func:`sweep` measures time and peak memory against sequence length for several attention
  functions (peak memory on CPU is sampled RSS: call
  :func:`ptcourse.core.measure.rss_follows_tensors` once first, as lab 04 does).
- :func:`use_attention` plugs any attention function into a ``TextClassifier``'s layers.
- :func:`backend_table` times every ``torch.nn.attention.sdpa_kernel`` backend (and the
  ``flash_attn`` package where installed) on one device: the GPU section's measurement.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode

from ptcourse.assets.models import SelfAttention, TextClassifier, naive_attention
from ptcourse.core import hardware, lineup, measure, numerics
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import pick
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import ZEN4_VM, Target

LAB = lineup.lab("06")

# Lab 06: attention_sdpa (F.scaled_dot_product_attention, the CPU flash kernel) against the
# grader's naive attention (baseline_attention), fp32, graded by check_speed and check_memory.
# Speed: interleaved pairs, 1 thread, batch 1, length 1024, head dim 64, 12 heads (8 in smoke),
# graded relative to reference_sdpa timed in the same run (checks.speed_check).
# Memory: sampled RSS with glibc thresholds pinned (measure.rss_follows_tensors), batch 1,
# 4 heads, length 4096 (2048 in smoke): naive keeps two score matrices alive, SDPA its output.
# Checks the judge runs outside the student's process (the rest run in the sandboxed worker).
# Quick-test cells whose points the judge's check of the same answer must vouch for.
VOUCHED = {
    "test_naive_visible": "naive",
    "test_blockwise_visible": "blockwise",
    "test_sdpa_visible": "sdpa",
}
JUDGED = ("naive", "blockwise", "blockwise_memory", "sdpa", "speed", "memory")
MEASURE = "tools/measure/lab06_attention.py"
LAB06_CUDA = "NOT measured (no GPU when this lab was written)"
TARGETS: tuple[Target, ...] = (
    Target("06", "speedup", "cpu", "speedup", 2.0, 1.3,
           f"{MEASURE}, reference_sdpa, 5 runs per mode: full 3.10–3.32x, median 3.15 (12 heads; "
           "1.86 s → 547 ms per call, the machine oversubscribed by other jobs, load average "
           "13–15 on 2 cores); smoke 3.06–3.38x, median 3.20 (8 heads)",
           "naive pasted as SDPA (baseline_attention), 5 runs per mode: full 0.92–1.03x, "
           "median 1.01; smoke 0.96–1.02x, median 1.00",
           ZEN4_VM, "2026-12-03", MEASURE),
    Target("06", "peak_memory", "cpu", "memory_ratio", 10.0, 3.0,
           f"{MEASURE}, reference_sdpa, 5 runs per mode: full 113–114x (516 → 4.6 MB); smoke "
           "51.1–51.8x (130 → 2.5 MB); naive = two score matrices + output, SDPA = its output "
           "+ tiles",
           "naive pasted as SDPA (baseline_attention): 1.00x in all 5 runs per mode (516 → 516 MB; "
           "smoke 130 → 130 MB)",
           ZEN4_VM, "2026-12-03", MEASURE),
    # Exercise 2 (the online softmax by hand) at its default block of 128 keys: its block of
    # scores (4 heads x 4096 x 128, fp32: 8 MB) and the temporaries made from it.
    Target("06", "blockwise_memory", "cpu", "memory_ratio", 4.0, 2.0,
           "reference_blockwise (block_size 128), check_blockwise_memory, 5 secret seeds per mode, "
           "other core loaded: full 12.4-12.5x (516 -> 41.4 MB); smoke 6.30-6.36x",
           "naive pasted as the blockwise answer: 1.00x in all 5 runs (516 -> 516 MB); a block "
           "of a quarter of the length (1024 keys) is expected near 2.6x",
           ZEN4_VM, "2026-12-05", f"{MEASURE} --blockwise"),
    Target("06", "blockwise_memory", "cuda", "memory_ratio", 4.0, 2.0,
           "not measured; expected as on CPU", "expected 1.0x (same naive code)", LAB06_CUDA,
           "2026-12-05"),
    Target("06", "speedup", "cuda", "speedup", 1.5, 1.15,
           "not measured; the claim lab 06 quotes: flash_attn fp16 1.8x on BERT-base (GPU unknown)",
           "expected 1.0x (same naive code)", LAB06_CUDA, "2026-12-03"),
    Target("06", "peak_memory", "cuda", "memory_ratio", 10.0, 3.0,
           "not measured; expected about 2 score matrices / output (~100x at length 4096)",
           "expected 1.0x (same naive code)", LAB06_CUDA, "2026-12-03"),
)  # fmt: skip

Attention = Callable[..., Tensor]  # fn(q, k, v, mask=None) -> Tensor

# The fused kernels SDPA dispatches to (CPU flash; CUDA flash, memory-efficient, cuDNN; others).
FUSED_KERNELS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_fused_attention_overrideable",
)
# (atol, rtol) against a float64 reference rounded to the output dtype. Measured worst errors
# (20 seeds, masked and unmasked): fp32 8e-7 (SDPA) / 9e-7 (naive); bf16 0.008 / 0.013.
TOLERANCE: dict[torch.dtype, tuple[float, float]] = {
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (3e-2, 3e-2),
    torch.float16: (5e-3, 5e-3),
}


@dataclass(frozen=True)
class Problem:
    """One attention problem: q, k, v of shape (batch, heads, length, dim)."""

    batch: int
    heads: int
    length: int
    dim: int = 64

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.batch, self.heads, self.length, self.dim)

    def score_bytes(self, dtype: torch.dtype = torch.float32) -> int:
        """Bytes of one (batch, heads, length, length) score matrix."""
        return self.batch * self.heads * self.length**2 * dtype.itemsize

    @property
    def flops(self) -> int:
        """Multiply-adds x 2 of q k^T and of p v: 4 * B * H * L^2 * D."""
        return 4 * self.batch * self.heads * self.length**2 * self.dim

    def __str__(self) -> str:
        return f"batch {self.batch}, {self.heads} heads, length {self.length}, head dim {self.dim}"


@dataclass(frozen=True)
class Sizes:
    """The graded timing problems, fp32 (the correctness checks use :data:`CASES`)."""

    speed: Problem  # length 1024; 12 heads as BERT-base (8 in smoke mode)
    memory: Problem  # a long sequence, 4 heads; length 4096 (2048 in smoke mode)


def sizes() -> Sizes:
    """The sizes in the current (smoke or full) mode; the same on every track."""
    return Sizes(
        speed=Problem(1, pick(12, 8), 1024, 64), memory=Problem(1, 4, pick(4096, 2048), 64)
    )


# The correctness checks' problems, in every mode: (problem, dtype, with a padding mask).
CASES: tuple[tuple[Problem, torch.dtype, bool], ...] = (
    (Problem(2, 3, 77, 32), torch.float32, False),
    (Problem(2, 3, 77, 32), torch.float32, True),
    (Problem(1, 2, 300, 64), torch.float32, True),
    (Problem(1, 2, 64, 32), torch.bfloat16, False),
    (Problem(2, 1, 48, 32), torch.bfloat16, True),
)


def qkv(
    problem: Problem,
    *,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Random q, k, v (standard normal, drawn in fp32 on CPU, then moved and cast)."""
    return tuple(
        torch.randn(problem.shape, generator=generator).to(device=device, dtype=dtype)
        for _ in range(3)
    )  # type: ignore[return-value]


def key_padding_mask(
    batch: int, length: int, generator: torch.Generator | None = None, device: str = "cpu"
) -> Tensor:
    """A (batch, 1, 1, length) boolean mask, True = may attend: each row keeps a random-length
    prefix of at least one key (the rest is padding), as a padded batch of texts would."""
    keep = torch.randint(1, length + 1, (batch,), generator=generator)
    mask = torch.arange(length)[None, :] < keep[:, None]
    return mask[:, None, None, :].to(device)


def baseline_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """The lab's starting point and the graders' baseline: the naive attention of
    :mod:`ptcourse.assets.models`, which materialises the (B, H, L, L) score matrix."""
    return naive_attention(q, k, v, mask)


def reference_sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """The instructors' ``attention_sdpa``: one call of ``F.scaled_dot_product_attention``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
    """The graders' reference: naive attention in float64, rounded to ``q``'s dtype."""
    out = naive_attention(q.double(), k.double(), v.double(), mask)
    return out.to(q.dtype)


@dataclass(frozen=True)
class Trace:
    """What one call dispatched: ATen ops in order and the largest tensor an op produced."""

    ops: tuple[str, ...]
    largest_bytes: int
    largest_shape: tuple[int, ...]

    @property
    def fused_kernels(self) -> tuple[str, ...]:
        return tuple(op for op in self.ops if op in FUSED_KERNELS)

    def summary(self) -> str:
        fused = ", ".join(self.fused_kernels) or "none"
        return (
            f"{len(self.ops)} ops ({', '.join(self.ops)}); fused attention kernel: {fused}; "
            f"largest tensor made {tuple(self.largest_shape)} = {self.largest_bytes / 2**20:.2f} MB"
        )


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.largest: tuple[int, tuple[int, ...]] = (0, ())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        self.ops.append(func.overloadpacket.__name__)
        outs = out if isinstance(out, tuple | list) else (out,)
        for t in outs:
            if isinstance(t, Tensor) and t.untyped_storage().nbytes() > self.largest[0]:
                self.largest = (t.untyped_storage().nbytes(), tuple(t.shape))
        return out


def trace(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Trace:
    """Run ``fn(*args, **kwargs)`` once and record the ATen ops it dispatched.

    Views (transpose, expand) count with the size of the storage they share, so the largest
    tensor is a fair picture of the biggest buffer the call allocated or touched.
    """
    with _Recorder() as rec:
        fn(*args, **kwargs)
    return Trace(tuple(rec.ops), rec.largest[0], rec.largest[1])


@dataclass(frozen=True)
class SweepResult:
    """Time (ms, median) and peak memory (MB) per length for each attention function; None
    where a function was skipped at that length (its score matrix over ``max_score_mb``)."""

    lengths: tuple[int, ...]
    ms: dict[str, list[float | None]]
    mb: dict[str, list[float | None]]


def sweep(
    functions: Mapping[str, Attention],
    lengths: Sequence[int],
    *,
    batch: int = 1,
    heads: int = 4,
    dim: int = 64,
    device: str = "cpu",
    min_run_time: float | None = None,
    max_score_mb: dict[str, float] | None = None,
) -> SweepResult:
    """Median time and peak memory of ``fn(q, k, v)`` for every function and length.

    ``max_score_mb`` maps a function name to the largest score matrix (MB, fp32) it is run with;
    longer lengths are skipped for it (a naive attention at length 16k would need 4 GB).
    """
    limits = max_score_mb or {}
    ms: dict[str, list[float | None]] = {name: [] for name in functions}
    mb: dict[str, list[float | None]] = {name: [] for name in functions}
    g = torch.Generator().manual_seed(0)
    for length in lengths:
        problem = Problem(batch, heads, length, dim)
        q, k, v = qkv(problem, device=device, generator=g)
        for name, fn in functions.items():
            if problem.score_bytes() / 2**20 > limits.get(name, math.inf):
                ms[name].append(None)
                mb[name].append(None)
                continue
            call = lambda fn=fn, q=q, k=k, v=v: fn(q, k, v)  # noqa: E731
            timing = measure.time_callable(call, min_run_time=min_run_time, warmup=1)
            ms[name].append(timing.median_s * 1e3)
            mb[name].append(measure.peak_memory(call, device=device).peak_mb)
    return SweepResult(tuple(lengths), ms, mb)


class _FunctionAttention(SelfAttention):
    """Self-attention that calls a given function ``fn(q, k, v, mask)``."""

    kind = "function"
    fn: Attention

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        return self.fn(q, k, v, mask)


def use_attention(model: TextClassifier, fn: Attention) -> TextClassifier:
    """Make every encoder layer of ``model`` compute attention with ``fn(q, k, v, mask)``,
    sharing (not copying) its weights; returns ``model``. ``mask`` is a (B, 1, 1, L) boolean
    key-padding mask (True = may attend) or None."""
    for layer in model.layers:
        attn = _FunctionAttention.sharing(layer.attn)
        attn.fn = fn
        layer.attn = attn
    return model


@dataclass(frozen=True)
class BackendRow:
    """One backend at one length: median ms and peak MB, or why it did not run."""

    backend: str
    length: int
    ms: float | None
    peak_mb: float | None
    note: str = ""

    def summary(self) -> str:
        if self.ms is None:
            return f"{self.backend:<20} L={self.length:<6} not run: {self.note}"
        return (
            f"{self.backend:<20} L={self.length:<6} {self.ms:9.3f} ms  peak +{self.peak_mb:9.1f} MB"
            + (f"  ({self.note})" if self.note else "")
        )


def _sdpa_backends() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend

    return {
        "math": SDPBackend.MATH,
        "flash": SDPBackend.FLASH_ATTENTION,
        "memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
        "cuDNN": SDPBackend.CUDNN_ATTENTION,
    }


def _flash_attn_function() -> Attention | None:
    """``flash_attn.flash_attn_func`` wrapped to take (B, H, L, D), or None if not installed."""
    if not hardware.backend("flash_attn").available:
        return None
    from flash_attn import flash_attn_func  # the package wants (B, L, H, D)

    def run(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return out.transpose(1, 2)

    return run


def _candidates(q: Tensor, k: Tensor, v: Tensor, unfused: bool) -> dict[str, Callable[[], Tensor]]:
    """SDPA forced onto each backend, as callables; the naive attention and SDPA's math backend
    (both materialise the score matrix) only if ``unfused``."""
    from torch.nn.attention import sdpa_kernel

    calls: dict[str, Callable[[], Tensor]] = {}
    if unfused:
        calls["naive"] = functools.partial(naive_attention, q, k, v)
    for name, backend in _sdpa_backends().items():
        if name == "math" and not unfused:
            continue

        def forced(backend: Any = backend) -> Tensor:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

        calls[f"sdpa {name}"] = forced
    return calls


def backend_table(
    device: str = "cuda",
    lengths: Sequence[int] = (1024, 4096, 16384),
    *,
    batch: int = 4,
    heads: int = 12,
    dim: int = 64,
    dtype: torch.dtype = torch.float16,
    min_run_time: float | None = None,
    max_score_mb: float = 8192,
) -> list[BackendRow]:
    """Time and peak memory of SDPA forced onto each backend (``sdpa_kernel``), of the naive
    attention, and of ``flash_attn.flash_attn_func`` where installed, at each length.

    A backend that cannot run here (wrong dtype, GPU too old, not a CUDA device) is listed with
    torch's reason; the naive attention and the math backend are skipped once the score matrix
    exceeds
    ``max_score_mb``. Works on CPU too (only math and flash exist there).
    """
    rows: list[BackendRow] = []
    flash_attn = _flash_attn_function() if device.startswith("cuda") else None
    g = torch.Generator().manual_seed(0)
    for length in lengths:
        problem = Problem(batch, heads, length, dim)
        q, k, v = qkv(problem, dtype=dtype, device=device, generator=g)
        want = None
        if problem.score_bytes(dtype) / 2**20 > max_score_mb:
            note = f"score matrix over {max_score_mb:g} MB: skipped"
            rows += [BackendRow(name, length, None, None, note) for name in ("naive", "sdpa math")]
        candidates = _candidates(q, k, v, problem.score_bytes(dtype) / 2**20 <= max_score_mb)
        if flash_attn is not None:
            candidates["flash_attn package"] = functools.partial(flash_attn, q, k, v)
        for name, call in candidates.items():
            try:
                with captured_stderr():
                    out = call()
            except (RuntimeError, NotImplementedError) as error:
                reason = str(error).strip().splitlines()[0] if str(error).strip() else ""
                rows.append(BackendRow(name, length, None, None, reason[:100]))
                continue
            note = ""
            if want is None:
                want = out.float()
            else:
                note = f"max diff vs first {numerics.max_abs_error(out, want):.1e}"
            del out
            timing = measure.time_callable(call, threads=None, min_run_time=min_run_time)
            peak = measure.peak_memory(call, device=device).peak_mb
            rows.append(BackendRow(name, length, timing.median_s * 1e3, peak, note))
    return rows


# ---------------------------------------------------------------------------------------------
# Exercise 2, the online softmax by hand: attention over blocks of keys, never the L x L matrix.


def reference_blockwise(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, block_size: int = 128
) -> Tensor:
    """The instructors' ``attention_blockwise``: walk over blocks of ``block_size`` keys keeping,
    per query row, the running maximum ``m``, the running sum ``l`` of exponentials relative to
    it and the unnormalised output ``o`` (fp32), rescaling both by ``exp(m - m_new)`` as each
    block arrives; return ``o / l``. ``mask`` as in :func:`baseline_attention`."""
    scale = 1 / math.sqrt(q.shape[-1])
    qs = q.float() * scale
    m = torch.full((*q.shape[:-1], 1), float("-inf"), device=q.device)
    total = torch.zeros_like(m)
    out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    for start in range(0, k.shape[-2], block_size):
        stop = start + block_size
        s = qs @ k[..., start:stop, :].float().transpose(-2, -1)
        if mask is not None:
            part = mask[..., start:stop]
            s = s.masked_fill(~part, float("-inf")) if part.dtype == torch.bool else s + part
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        p = torch.exp(s - shift)
        rescale = torch.exp(m - shift)
        total = rescale * total + p.sum(dim=-1, keepdim=True)
        out = rescale * out + p @ v[..., start:stop, :].float()
        m = m_new
    return (out / total).to(q.dtype)


# The problem on which the answer may not make a tensor of a quarter of the full score matrix
# or more (with its block size, 64 keys, the block's scores are an eighth of it).
LONG_CASE = (Problem(1, 2, 512, 32), 64)
# Block sizes the checks ask for, case by case (none divides its length: the last block is short).
BLOCKS = (29, 16, 96, 48, 20)


def trace_with_block(answer: Attention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None,
                     block_size: int) -> Trace:  # fmt: skip
    """:func:`trace` of ``answer(q, k, v, mask, block_size)`` (run where the answer lives)."""
    return trace(answer, q, k, v, mask, block_size)


def blockwise_errors(answer: Attention, generator: torch.Generator) -> list[str]:
    """The rules ``attention_blockwise`` must keep, on :data:`CASES` and :data:`LONG_CASE` from
    ``generator``: the float64 reference's output at every block size (a short last block, a
    padding mask), no fused kernel, and no tensor of a quarter of the score matrix or more on
    the long case. Returns the broken rules (empty: all kept)."""
    broken = []
    cases = [(p, d, m, b) for (p, d, m), b in zip(CASES, BLOCKS, strict=True)]
    cases.append((LONG_CASE[0], torch.float32, True, LONG_CASE[1]))
    for problem, dtype, masked, block in cases:
        q, k, v = qkv(problem, dtype=dtype, generator=generator)
        mask = (
            key_padding_mask(problem.batch, problem.length, generator=generator) if masked else None
        )
        what = f"{problem}, {dtype}, block_size {block}, {'padding mask' if masked else 'no mask'}"
        with captured_stderr():
            out = answer(q, k, v, mask, block)
            seen = checks.beside(answer, trace_with_block, q, k, v, mask, block)
        atol, rtol = TOLERANCE[dtype]
        want = reference(q, k, v, mask)
        if not isinstance(out, Tensor) or out.shape != want.shape or out.dtype != want.dtype:
            broken.append(f"{what}: return a tensor of q's shape and dtype")
        elif not torch.allclose(out, want, atol=atol, rtol=rtol):
            broken.append(f"{what}: max abs error {numerics.max_abs_error(out, want):.2g}")
        if seen.fused_kernels:
            broken.append(f"{what}: called {seen.fused_kernels[0]} (write the loop yourself)")
        if (problem, block) == LONG_CASE and seen.largest_bytes * 4 >= problem.score_bytes():
            broken.append(
                f"{what}: made a tensor {seen.largest_shape} of {seen.largest_bytes / 2**10:.0f} "
                f"KB, a quarter or more of the {problem.score_bytes() / 2**10:.0f} KB score matrix"
            )
    return broken


# ---------------------------------------------------------------------------------------------
# The checks: fresh secret inputs, the package's own naive attention as the baseline.


def _check_cases(answer: Attention, name: str, *, fused: bool, points: float) -> float:
    """``answer`` against the float64 reference on :data:`CASES` (its outputs are data, checked
    here), then what the judge sees of how it computes: ``fused`` (attention_sdpa) must stay
    under a quarter of a score matrix of memory at ``sizes().memory``, as a fused kernel does;
    not ``fused`` (attention_naive) must make the score matrix (:func:`score_matrices`)."""
    gen = checks.secret_generator()
    for problem, dtype, masked in CASES:
        q, k, v = qkv(problem, dtype=dtype, generator=gen)
        mask = key_padding_mask(problem.batch, problem.length, generator=gen) if masked else None
        with captured_stderr():
            out = answer(q, k, v, mask)
        atol, rtol = TOLERANCE[dtype]
        what = f"{name}, {problem}, {dtype}, {'padding mask' if masked else 'no mask'}"
        checks.check_close(out, reference(q, k, v, mask), atol=atol, rtol=rtol, what=what)
    print(f"{name} matches the float64 reference in all {len(CASES)} cases")
    made = score_matrices(answer)
    problem = sizes().memory
    if fused and made >= FUSED_AT_MOST:
        raise checks.CheckFailed(
            f"{name} at {problem} needed {made:.2f} score matrices of memory: a fused kernel "
            f"keeps under {FUSED_AT_MOST} (it never makes the L x L scores)"
        )
    if not fused and made < NAIVE_AT_LEAST:
        raise checks.CheckFailed(
            f"{name} at {problem} needed only {made:.2f} score matrices of memory: naive "
            "attention makes the L x L scores (write it with matmul and softmax, no fused kernel)"
        )
    print(f"peak memory at {problem}: {made:.2f} score matrices, as {name} should")
    return float(points)


# What the judge measures of how an attention computes (peak memory of one fp32 call at
# sizes().memory, in score matrices): naive attention 2.0-2.1, the CPU flash kernel 0.04
# (tools/measure/lab06_attention.py's peak_memory row: 130 MB and 2.5 MB at smoke size, one
# score matrix 64 MB).
FUSED_AT_MOST, NAIVE_AT_LEAST = 0.25, 0.9


def score_matrices(answer: Attention) -> float:
    """Peak memory of one call of ``answer`` on fresh fp32 inputs at ``sizes().memory``, in
    score matrices (B x H x L x L floats): measured by the judge, for the whole sandbox, and
    its output checked."""
    problem = sizes().memory
    measure.rss_follows_tensors()
    with captured_stderr():
        peak = measure.peak_memory(checks.timed(answer, fresh_inputs(problem, "cpu"), _verify))
    return peak.peak_bytes / problem.score_bytes()


def fresh_inputs(problem: Problem, device: str) -> Callable[[], tuple[Tensor, Tensor, Tensor]]:
    """q, k, v from the secret seed, new ones at every call (what the judge times)."""
    gen = checks.secret_generator()
    return lambda: qkv(problem, device=device, generator=gen)


def _verify(args: tuple[Tensor, ...], out: Tensor, what: str = "timed output") -> None:
    """``out`` against the grader's naive attention on ``args`` (fp32 tolerance)."""
    atol, rtol = TOLERANCE[torch.float32]
    checks.check_close(out, baseline_attention(*args), atol=atol, rtol=rtol, what=what)


def check_naive(attention_naive: Attention, *, points: float) -> float:
    """attention_naive on fresh inputs, fp32 and bf16, masked or not, with no fused kernel."""
    return _check_cases(attention_naive, "attention_naive", fused=False, points=points)


def check_sdpa(attention_sdpa: Attention, *, points: float) -> float:
    """attention_sdpa on fresh inputs, fp32 and bf16, masked or not, through a fused kernel."""
    return _check_cases(attention_sdpa, "attention_sdpa", fused=True, points=points)


def check_speed(attention_sdpa: Attention, *, points: float) -> float:
    """attention_sdpa's speedup over :func:`baseline_attention` at ``sizes().speed``, relative
    to what :func:`reference_sdpa` reaches in the same run, after checking its output there.
    Where SDPA does not pay off on this machine, the fused kernel in effect is graded."""
    goal = targets.goal(TARGETS, "speedup")
    problem = sizes().speed
    q, k, v = qkv(problem, device=goal.track.device, generator=checks.secret_generator())
    with captured_stderr():
        got = attention_sdpa(q, k, v)
    _verify((q, k, v), got, what=f"attention_sdpa, {problem}")
    del got
    print(f"timing {problem}")

    def fused_kernel_ran(reason: str) -> float:
        made = score_matrices(attention_sdpa)
        if made >= FUSED_AT_MOST:
            raise checks.CheckFailed(f"{reason}; and it needed {made:.2f} score matrices of "
                                     "memory: no fused kernel")  # fmt: skip
        print(f"graded instead: it ran as a fused kernel does ({made:.2f} score matrices)")
        return float(points)

    checks.run_alike(attention_sdpa, measure.rss_follows_tensors)  # as the setup cell did here
    return checks.speed_check(
        goal,
        attention_sdpa,
        fresh=fresh_inputs(problem, goal.track.device),
        verify=_verify,
        baseline=baseline_attention,
        reference=reference_sdpa,
        points=points,
        not_gradable=fused_kernel_ran,
    )


def check_memory(attention_sdpa: Attention, *, points: float) -> float:
    """How many times less peak memory attention_sdpa needs than :func:`baseline_attention`
    at ``sizes().memory`` (sampled RSS with glibc pinned on a CPU, the allocator on a GPU)."""
    goal = targets.goal(TARGETS, "peak_memory")
    measure.rss_follows_tensors()
    problem = sizes().memory
    q, k, v = qkv(problem, device=goal.track.device, generator=checks.secret_generator())
    with captured_stderr():
        attention_sdpa(q, k, v), baseline_attention(q, k, v)  # warm-up
    print(f"peak memory {problem}; one score matrix {problem.score_bytes() / 2**20:.0f} MB")
    fresh = fresh_inputs(problem, goal.track.device)
    candidate = checks.timed(attention_sdpa, fresh, _verify)  # the measured call's output too
    checks.run_alike(attention_sdpa, measure.rss_follows_tensors)  # as the setup cell did here
    baseline = checks.timed_alike(attention_sdpa, baseline_attention, fresh)
    return checks.memory(goal, baseline, candidate, points=points)


# Exercise 2, the online softmax by hand


def check_blockwise(attention_blockwise: Attention, *, points: float) -> float:
    """Exercise 2 on fresh inputs from the secret seed (:func:`blockwise_errors`)."""
    broken = blockwise_errors(attention_blockwise, checks.secret_generator())
    if broken:
        raise checks.CheckFailed("attention_blockwise: " + "; ".join(broken[:3]))
    print(f"attention_blockwise matches the float64 reference in all {len(CASES) + 1} cases, "
          "block by block, with no fused kernel and no score matrix")  # fmt: skip
    return float(points)


def check_blockwise_memory(attention_blockwise: Attention, *, points: float) -> float:
    """How many times less peak memory ``attention_blockwise`` (its own default block size)
    needs than :func:`baseline_attention` at ``sizes().memory``, after checking its output
    there (sampled RSS, as :func:`check_memory`)."""
    goal = targets.goal(TARGETS, "blockwise_memory")
    measure.rss_follows_tensors()
    problem = sizes().memory
    q, k, v = qkv(problem, device=goal.track.device, generator=checks.secret_generator())
    with captured_stderr():
        got = attention_blockwise(q, k, v)
    _verify((q, k, v), got, what=f"attention_blockwise, {problem}")
    del got
    print(f"peak memory {problem}; one score matrix {problem.score_bytes() / 2**20:.0f} MB")
    fresh = fresh_inputs(problem, goal.track.device)
    candidate = checks.timed(attention_blockwise, fresh, _verify)  # the measured call's output
    checks.run_alike(attention_blockwise, measure.rss_follows_tensors)
    baseline = checks.timed_alike(attention_blockwise, baseline_attention, fresh)
    return checks.memory(goal, baseline, candidate, points=points)
