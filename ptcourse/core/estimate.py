"""How long a lab takes at full size on this machine, from a short measured probe.

Each lab's full-size run was timed once on the course's reference machine (``FULL_SIZE_S``,
``ptcourse run`` with two lanes: the other core busy), together with :func:`probe_seconds` there
(``PROBE_S``). Here the probe runs again (about a quarter of a second) and the lab's time is
scaled by how much slower or faster this machine ran it. The probe mixes what the labs spend
their time on, at one thread: a matrix product, a convolution, a JPEG decode and a Python loop.
It is an estimate: a lab whose time sits in one kind of work (bf16 on a CPU without bf16 units,
a C++ compile) can differ by more than the probe says.
"""

from __future__ import annotations

import io
import statistics
import time

import torch

from ptcourse.core.measure import pinned_threads

# Measured with `ptcourse run --lanes 2` (each lab beside a busy neighbour; 13 min 13 s for all
# fourteen, with two more test processes running at times, so these lean long) and
# probe_seconds(repeats=9) on the idle machine (five runs: 11.5-12.5 ms, median 11.8; under
# ATEN_CPU_CAPABILITY=avx2 and =default 12.0 and 11.4 ms: the probe follows the cores' speed,
# not the dispatch), on the 2-core Intel Xeon VM (AVX-512, AMX), 2026-12-07.
PROBE_S = 0.0118
FULL_SIZE_S: dict[str, float] = {
    "00": 43, "01": 121, "02": 74, "03": 75, "04": 32, "05": 396, "06": 48,
    "07": 22, "08": 38, "09": 52, "10": 112, "11": 50, "12": 60, "13": 206,
}  # fmt: skip
WHERE = "the course's 2-core Intel Xeon VM (AVX-512, AMX), 2026-12-07"


def _jpeg() -> bytes:
    from PIL import Image

    image = Image.effect_noise((512, 512), 64).convert("RGB")
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _probe_once(data: bytes, a: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> float:
    from PIL import Image

    start = time.perf_counter()
    for _ in range(4):
        a @ a
    torch.nn.functional.conv2d(x, w, padding=1)
    Image.open(io.BytesIO(data)).convert("RGB").load()
    total = 0
    for i in range(200_000):
        total += i & 7
    return time.perf_counter() - start


def probe_seconds(repeats: int = 5) -> float:
    """The median time of the probe on this machine, one thread (about 12 ms a repeat)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(384, 384, generator=gen)
    x, w = torch.randn(1, 32, 64, 64, generator=gen), torch.randn(32, 32, 3, 3, generator=gen)
    data = _jpeg()
    with pinned_threads(1), torch.inference_mode():
        _probe_once(data, a, x, w)  # first calls load kernels
        return statistics.median(_probe_once(data, a, x, w) for _ in range(repeats))


def full_size_seconds(lab: str, probe: float | None = None) -> float | None:
    """Lab ``lab``'s full-size run on this machine, estimated (None: never measured)."""
    measured = FULL_SIZE_S.get(lab)
    if measured is None or PROBE_S <= 0:
        return None
    here = probe_seconds() if probe is None else probe
    return measured * here / PROBE_S


def full_size_line(lab: str) -> str:
    """One line for a learner about to run lab ``lab`` at full size."""
    probe = probe_seconds()
    seconds = full_size_seconds(lab, probe)
    if seconds is None:
        return f"Full size: lab {lab}'s time has not been measured; SMOKE = True takes a minute."
    return (
        f"Full size: about {_minutes(seconds)} on this machine (a short probe took "
        f"{probe * 1e3:.0f} ms here and {PROBE_S * 1e3:.0f} ms on {WHERE}, where this lab took "
        f"{_minutes(FULL_SIZE_S[lab])}); SMOKE = True runs it in about a minute."
    )


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def run_plan(labs: list[str], lanes: int = 1) -> str:
    """What a full-size ``ptcourse run`` of ``labs`` will take here, lab by lab and in all."""
    probe = probe_seconds()
    each = {lab: full_size_seconds(lab, probe) for lab in labs}
    known = [s for s in each.values() if s is not None]
    lines = [f"  lab {lab}: " + (_minutes(s) if s is not None else "not measured")
             for lab, s in each.items()]  # fmt: skip
    total = f"about {_minutes(sum(known) / max(lanes, 1))}" if known else "unknown"
    return "\n".join(
        [f"full sizes on this machine ({total} in {lanes} lane(s), from a probe of "
         f"{probe * 1e3:.0f} ms against {PROBE_S * 1e3:.0f} ms on {WHERE}):", *lines]
    )  # fmt: skip
