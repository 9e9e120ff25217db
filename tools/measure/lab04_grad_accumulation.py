"""Measure what lab 04's target rows grade: the peak-memory ratio of ``check_memory``.

    .venv/bin/python tools/measure/lab04_grad_accumulation.py --runs 5

For each mode (full and smoke sizes) and each answer — the reference solution (the
``accumulated_step`` cell of the solution notebook) and a baseline-equivalent answer (one batch,
``accum_steps`` ignored, as ``tests/integration/submissions/lab04.py`` submits) — it runs
``ptcourse.labs.lab04_grad_accumulation.check_memory`` ``--runs`` times, each in a fresh Python
(a clean heap, like a notebook kernel, with ``measure.rss_follows_tensors()`` called first as the
setup cell does), one torch thread, a fresh secret seed per run, and a busy-loop process on
another core. It prints the measured ratios per row. The gradient and AMP checks are not timed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "solutions" / "04-grad-accumulation" / "04-grad-accumulation.ipynb"
ANSWERS = ("reference", "baseline")


def reference_step():
    """The solution notebook's ``accumulated_step``, executed from its cell."""
    import torch

    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["metadata"].get("nbgrader", {}).get("grade_id") == "accumulated_step"
    ]
    namespace = {"torch": torch}
    exec(source, namespace)
    return namespace["accumulated_step"]


def baseline_equivalent(model, loss_fn, x, y, accum_steps, scaler=None):
    """One forward and backward over the whole batch: the lab's baseline, pasted in."""
    from ptcourse.labs import lab04_grad_accumulation as lab

    return lab.baseline_step(model, loss_fn, x, y)


def child(answer: str) -> None:
    """One graded run in this (fresh) process; prints the measured ratio and peaks as JSON."""
    import torch

    from ptcourse.core import measure

    measure.rss_follows_tensors()  # the notebook's setup cell, before any big tensor
    torch.set_num_threads(1)
    from ptcourse.grading import checks
    from ptcourse.labs import lab04_grad_accumulation as lab

    step = reference_step() if answer == "reference" else baseline_equivalent
    with contextlib.suppress(checks.CheckFailed):
        lab.check_memory(step, points=3)
    result = checks.RESULTS[-1]
    peaks = [float(mb) for mb in re.findall(r"peak \+([\d.]+) MB", result.message)]
    print(json.dumps({"value": result.value, "points": result.points, "peaks_mb": peaks}))


def run_once(answer: str, smoke: bool, seed: int) -> dict:
    env = {
        **os.environ,
        "PTCOURSE_SMOKE": "1" if smoke else "0",
        "PTCOURSE_SECRET_SEED": str(seed),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, __file__, "--child", answer],
        env=env, cwd=ROOT, capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(name: str, runs: list[dict]) -> str:
    values = [r["value"] for r in runs]
    base = statistics.median(r["peaks_mb"][0] for r in runs)
    cand = statistics.median(r["peaks_mb"][1] for r in runs)
    return (
        f"  {name:<10} {min(values):.2f}–{max(values):.2f}x, median {statistics.median(values):.2f}"
        f" ({base:.1f} → {cand:.1f} MB), {len(values)} runs; "
        f"points {sorted({r['points'] for r in runs})}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=("full", "smoke"), default=["full", "smoke"])
    parser.add_argument("--child", choices=ANSWERS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    from ptcourse.core import hardware, measure

    track = hardware.track_for("04")  # the row graded here: cpu, or cuda on a GPU machine
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes:
            print(f"peak_memory ({track.name} row), {mode} sizes, 1 thread, other core loaded:",
                  flush=True)  # fmt: skip
            for answer in ANSWERS:
                runs = [run_once(answer, mode == "smoke", seed) for seed in range(args.runs)]
                print(summary(answer, runs), flush=True)


if __name__ == "__main__":
    main()
