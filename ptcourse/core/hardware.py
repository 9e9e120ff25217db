"""What this machine offers, and which track each lab runs on it.

Every probe is defensive: a missing or broken optional package is reported, never raised.
"""

from __future__ import annotations

import functools
import getpass
import importlib
import os
import platform
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from ptcourse.core import versions
from ptcourse.core.lineup import LABS, Lab, lab
from ptcourse.core.quiet import captured_stderr

# capability name -> module to import
BACKENDS: dict[str, str] = {
    "dali": "nvidia.dali",
    "flash_attn": "flash_attn",
    "tensorrt": "tensorrt",
    "torch_tensorrt": "torch_tensorrt",
    "onnxruntime": "onnxruntime",
    "torchao": "torchao",
}
# The flags the labs care about: vector width, fast bf16, fast int8 (VNNI / AMX).
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
INT8_FLAGS = ("avx2", "avx_vnni", "avx512_vnni", "amx_int8")


@dataclass(frozen=True)
class Backend:
    name: str
    available: bool
    version: str = ""
    detail: str = ""  # why it is unavailable, or extra facts (ORT providers)


@dataclass(frozen=True)
class Cuda:
    available: bool
    name: str = ""
    capability: str = ""
    memory_gb: float = 0.0


@dataclass(frozen=True)
class Track:
    """The track a lab runs here: "cuda", "cpu", or "cpu-basic" (a needed CPU backend is absent)."""

    name: str
    reason: str

    @property
    def device(self) -> str:
        return "cuda" if self.name == "cuda" else "cpu"


@dataclass(frozen=True)
class Machine:
    cpu_model: str
    cpu_flags: tuple[str, ...]
    cpu_capability: str
    threads: int
    cuda: Cuda
    backends: tuple[Backend, ...]

    @property
    def fast_bf16(self) -> bool:
        return has("fast_bf16")


def _cpu_info() -> tuple[str, tuple[str, ...]]:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    known = dict.fromkeys(CPU_FLAGS + INT8_FLAGS)
    return model, tuple(flag for flag in known if flag in flags)


def cpu_flags() -> tuple[str, ...]:
    """Which of :data:`CPU_FLAGS` and :data:`INT8_FLAGS` this CPU advertises (/proc/cpuinfo)."""
    return _cpu_info()[1]


def usable_threads() -> int:
    """Cores this process may run on (affinity-aware where the OS tells)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _cuda() -> Cuda:
    try:
        if not torch.cuda.is_available():
            return Cuda(False)
        props = torch.cuda.get_device_properties(0)
        return Cuda(True, props.name, f"{props.major}.{props.minor}", props.total_memory / 2**30)
    except Exception:  # a broken driver reads as "no CUDA"
        return Cuda(False)


@functools.cache
def backend(name: str) -> Backend:
    """Import one optional backend quietly and say whether it works."""
    module_name = BACKENDS[name]
    try:
        with captured_stderr():
            module = importlib.import_module(module_name)
    except Exception as error:  # ImportError, or a broken install raising anything
        first_line = str(error).splitlines()[0] if str(error) else type(error).__name__
        return Backend(name, False, detail=f"{type(error).__name__}: {first_line}"[:120])
    detail = ""
    if name == "onnxruntime":
        detail = "providers: " + ", ".join(module.get_available_providers())
    return Backend(name, True, str(getattr(module, "__version__", "")), detail)


@functools.cache
def machine() -> Machine:
    """Probe this machine once per process."""
    model, flags = _cpu_info()
    return Machine(
        cpu_model=model,
        cpu_flags=flags,
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=usable_threads(),
        cuda=_cuda(),
        backends=tuple(backend(name) for name in BACKENDS),
    )


def has(capability: str) -> bool:
    """Whether this machine has ``capability``: "cuda", "fast_bf16" or an optional backend's
    name — cheap, unlike ``machine()``, which imports every backend."""
    if capability == "cuda":
        return _cuda().available
    if capability == "cxx_compiler":
        return cxx_compiler().available
    if capability == "fast_bf16":
        _, flags = _cpu_info()
        advertised = "amx_bf16" in flags or "avx512_bf16" in flags
        return advertised and bf16_matmul_ratio() < FAST_BF16_RATIO
    return backend(capability).available


# bf16 counts as fast when a bf16 matmul is at least as fast as fp32 here. Measured on a Zen 4
# EPYC (avx512_bf16), 256x256, 1 thread, best of 5: 0.36 with every kernel in use; 2.5 with
# ONEDNN_MAX_CPU_ISA=AVX512_CORE and 24-28 with ONEDNN_MAX_CPU_ISA=AVX2, where the CPU flags
# still advertise avx512_bf16: the flags say what the CPU has, this says what the kernels use.
FAST_BF16_RATIO = 1.0


@functools.cache
def bf16_matmul_ratio(n: int = 256, repeats: int = 5) -> float:
    """Time of a bf16 matmul over an fp32 one here (1 thread, best of ``repeats``)."""

    def best(dtype: torch.dtype) -> float:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        a @ b
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            a @ b
            times.append(time.perf_counter() - start)
        return min(times)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return best(torch.bfloat16) / best(torch.float32)
    finally:
        torch.set_num_threads(threads)


@functools.cache
def cxx_compiler() -> Backend:
    """Whether the C++ compiler torch.compile's inductor would use builds a program here.

    Inductor writes C++ kernels for the CPU and compiles them on first call; without a working
    compiler every ``torch.compile`` with the default backend fails at that call."""
    try:
        with captured_stderr():
            from torch._inductor.cpp_builder import get_cpp_compiler

            compiler = get_cpp_compiler()
    except Exception as error:  # no compiler found, or inductor itself broken
        return Backend("C++ compiler", False, detail=f"{type(error).__name__}: {error}"[:120])
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "probe.cpp"
        source.write_text("int main() { return 0; }\n")
        try:
            built = subprocess.run(
                [compiler, str(source), "-o", str(Path(folder) / "probe")],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            return Backend("C++ compiler", False, detail=f"{compiler}: {error}"[:120])
    if built.returncode != 0:
        return Backend("C++ compiler", False, detail=f"{compiler}: {built.stderr.strip()}"[:120])
    return Backend("C++ compiler", True, detail=f"{compiler} (torch.compile's inductor)")


def separate_inductor_cache() -> str:
    """Give inductor a cache folder of this CPU configuration's own, unless one is set, and
    return it. Inductor's on-disk cache is not keyed by ``ATEN_CPU_CAPABILITY`` or
    ``ONEDNN_MAX_CPU_ISA``: on the Zen 4 VM (2026-12-04) a scorer compiled natively and then
    again under ``ATEN_CPU_CAPABILITY=avx2`` loaded the AVX-512 kernels and returned NaN, and
    the reverse order crashed the process; each configuration with its own folder was right."""
    if not os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").lower()
        capability = torch.backends.cpu.get_cpu_capability().lower()
        name = f"torchinductor_{getpass.getuser()}_{capability}"
        folder = Path(tempfile.gettempdir()) / (f"{name}_onednn_{isa}" if isa else name)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def inductor_probe_env() -> dict[str, str]:
    """``TORCHINDUCTOR_VEC_ISA_OK=1`` where inductor's check of the CPU's vector units passes for
    every instruction set the CPU advertises, else nothing. Run where the course's own code runs
    (the judge), with this configuration's cache folder, it spares a sandboxed worker, whose
    cache starts empty, the check's test builds: 11 s of every Lab 12 submission's worker and
    twin on the Sapphire Rapids VM (2026-12-07)."""
    separate_inductor_cache()
    with captured_stderr():
        from torch._inductor import cpu_vec_isa

        passed = cpu_vec_isa.valid_vec_isa_list()
        advertised = cpu_vec_isa.x86_isa_checker() if platform.machine() == "x86_64" else []
    wanted = [isa for isa in cpu_vec_isa.supported_vec_isa_list
              if all(flag in advertised for flag in str(isa).split())]  # fmt: skip
    return {"TORCHINDUCTOR_VEC_ISA_OK": "1"} if wanted and passed == wanted else {}


def _missing(needs: tuple[str, ...]) -> list[str]:
    return [need for need in needs if not has(need)]


def track_for(which: str | Lab) -> Track:
    """The track lab ``which`` runs here, with the reason (only probes what that lab needs)."""
    the_lab = which if isinstance(which, Lab) else lab(which)
    forced = os.environ.get("PTCOURSE_TRACK")
    if forced:
        return Track(forced, "forced by PTCOURSE_TRACK")
    if the_lab.has_gpu_track:
        gpu_missing = _missing(("cuda", *the_lab.gpu_needs))
        if not gpu_missing:
            return Track("cuda", f"CUDA device {_cuda().name} present")
        gpu_reason = f"GPU track needs {', '.join(gpu_missing)}"
    else:
        gpu_reason = "this lab has no GPU track"
    cpu_missing = _missing(the_lab.cpu_needs)
    if cpu_missing:
        return Track("cpu-basic", f"{gpu_reason}; full CPU track needs {', '.join(cpu_missing)}")
    return Track("cpu", gpu_reason)


def _bf16_line(m: Machine) -> str:
    if not ("amx_bf16" in m.cpu_flags or "avx512_bf16" in m.cpu_flags):
        return "no (needs AMX or avx512_bf16)"
    ratio = bf16_matmul_ratio()
    verdict = "yes" if m.fast_bf16 else "no: the kernels in use do not use the CPU's bf16"
    return f"{verdict} (a bf16 matmul takes {ratio:.2f}x the time of fp32 here)"


def doctor_report() -> str:
    """A readable table of this machine's capabilities and each lab's track."""
    m = machine()
    cuda = (
        f"{m.cuda.name} (sm {m.cuda.capability}, {m.cuda.memory_gb:.0f} GiB)"
        if m.cuda.available
        else "not available"
    )
    lines = [
        "ptcourse doctor — what this machine offers",
        "",
        f"  {'CPU':<16}{m.cpu_model}",
        f"  {'CPU flags':<16}{', '.join(m.cpu_flags) or 'none of ' + ', '.join(CPU_FLAGS)}",
        f"  {'torch':<16}{torch.__version__} (CPU kernels: {m.cpu_capability})",
        f"  {'threads':<16}{m.threads} usable; graded timing uses 1",
        f"  {'fast bf16':<16}{_bf16_line(m)}",
        f"  {'CUDA':<16}{cuda}",
        "",
        "Optional backends",
    ]
    for b in (*m.backends, cxx_compiler()):
        state = f"yes {b.version}" if b.available else "no"
        lines.append(f"  {b.name:<16}{state:<12}{b.detail}")
    lines += ["", *versions.report_lines(), "", "Labs and the track each runs here"]
    for each in LABS:
        track = track_for(each)
        lines.append(f"  {each.name:<24}{track.name:<11}{track.reason}")
    return "\n".join(lines)
