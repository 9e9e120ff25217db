"""The course's lab lineup: one row per lab, the single list every tool reads.

It sits in ``core`` (not beside the lab modules in ``ptcourse.labs``) because which track a lab
runs is a question about this machine that :mod:`ptcourse.core.hardware` answers, and core
imports nothing above it. The row is metadata only; the lab's code is its module (``module``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ptcourse.core.errors import CourseInputError


@dataclass(frozen=True)
class Lab:
    """One lab: where it lives, what it needs on each track."""

    number: str
    slug: str
    title: str
    minutes: int
    cpu_track: str
    gpu_track: str
    gpu_needs: tuple[str, ...] = ()  # capabilities beyond CUDA; () and gpu_track "—" = no GPU track
    cpu_needs: tuple[str, ...] = ()  # without these the lab runs its reduced "cpu-basic" track
    claim: str = ""  # the published claim the lab tests, shown beside its measurements

    @property
    def name(self) -> str:
        return f"{self.number}-{self.slug}"

    @property
    def module(self) -> str:
        """The dotted name of this lab's module, e.g. ``ptcourse.labs.lab06_attention``."""
        return f"ptcourse.labs.lab{self.number}_{self.slug.replace('-', '_')}"

    @property
    def has_gpu_track(self) -> bool:
        return self.gpu_track != "—"


LABS: tuple[Lab, ...] = (
    Lab("00", "measuring-right", "Measuring right", 60,
        "timing, warm-up, threads, noise, CIs, roofline of this machine",
        "CUDA sync/events, L2 effects"),
    Lab("01", "data-loading", "Data loading", 120,
        "DataLoader knobs; decode-once cache; batched tensor augmentation",
        "pin_memory + non_blocking; GPU augmentation",
        claim="restructuring the data pipeline: training iterations 4x faster"),
    Lab("02", "dali", "NVIDIA DALI", 120,
        "DALI CPU pipeline vs PIL loader (torchvision.io without DALI)",
        "mixed (GPU) JPEG decode", gpu_needs=("dali",), cpu_needs=("dali",),
        claim="a DALI pipeline over 3x faster than torchvision (ImageNet scale, GPU decode)"),
    Lab("03", "mixed-precision", "Mixed precision", 90,
        "bf16 autocast (needs AMX/avx512_bf16 to be fast)",
        "fp16 autocast + GradScaler, bf16", cpu_needs=("fast_bf16",),
        claim="autocast + GradScaler: an NLP classifier 2.1x faster (GPU)"),
    Lab("04", "grad-accumulation", "Gradient accumulation", 60,
        "equal gradients, lower peak memory, LR scaling",
        "with AMP + GradScaler, CUDA memory stats",
        claim="accumulation with AMP: +40% speed at equal accuracy"),
    Lab("05", "efficient-blocks", "Efficient conv blocks", 90,
        "dw-separable + SE + GELU: FLOPs vs accuracy vs latency", "channels_last + AMP",
        claim="dw-separable + SE + GELU: -60% FLOPs at -0.3% accuracy"),
    Lab("06", "attention", "Attention: naive to flash", 90,
        "naive vs SDPA (flash CPU kernel): time and memory vs length",
        "SDPA backends, flash-attn package",
        claim="Flash Attention: 1.8x faster on BERT-base, 35% less memory (GPU)"),
    Lab("07", "export", "Export: torch.export, ONNX, ORT", 90,
        "torch.export → ONNX (dynamo) → ONNX Runtime; TorchScript as legacy",
        "ORT CUDA provider"),
    Lab("08", "tensorrt", "TensorRT", 90,
        "fusion, graph optimisation, precision via ONNX Runtime",
        "TensorRT / Torch-TensorRT FP16 engine", gpu_needs=("tensorrt",),
        claim="TensorRT: ResNet-50 45 -> 11 ms; FP16 2x at < 0.5% accuracy loss (Jetson)"),
    Lab("09", "profiling", "Profiling", 90,
        "torch.profiler: find and fix a planted bottleneck", "CUDA activity, GPU utilisation",
        claim="after profiling, throughput up 3x"),
    Lab("10", "quantization", "Quantization", 90,
        "int8 dynamic (torchao; torch.ao as legacy; ORT)", "—",
        claim="dynamic int8: smaller model, faster inference"),
    Lab("11", "batching", "Batching", 60, "throughput vs latency vs batch size", "—"),
    Lab("12", "torch-compile", "torch.compile", 90,
        "compile cost and break-even, graph breaks, recompiles, freezing for CPU inference",
        "—", cpu_needs=("cxx_compiler",)),
    Lab("13", "capstone", "Capstone: inspection model ≥ 10x", 120,
        "make it ≥ 10x faster end to end", "≥ 15x",
        claim="the whole line >= 10x faster end to end"),
)  # fmt: skip


class UnknownLab(CourseInputError, KeyError):
    """A key that names no lab (a KeyError, as a lookup that fails)."""


def lab(key: str) -> Lab:
    """Find a lab by number ("01"), name ("01-data-loading") or slug ("data-loading")."""
    for candidate in LABS:
        short = candidate.number.lstrip("0") or "0"  # "6" for 06, "0" (not "") for 00
        if key in (candidate.number, candidate.name, candidate.slug, short):
            return candidate
    raise UnknownLab(
        f"no lab {key!r}: name one by number (06) or name (06-attention); "
        f"the labs are {', '.join(x.name for x in LABS)}"
    )
