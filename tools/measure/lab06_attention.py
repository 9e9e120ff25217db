"""Measure what lab 06's target rows grade, through the graders' own checks.

For each run and each mode (full, smoke), ``check_speed`` and ``check_memory`` of
``ptcourse.labs.lab06_attention`` grade the reference solution (``reference_sdpa``, one call of
``F.scaled_dot_product_attention``) and a baseline-equivalent answer (``baseline_attention``, the
naive attention pasted as the SDPA exercise), on fresh secret inputs, with one torch thread and
a busy-loop process keeping the other core loaded. Prints, per row, the spread of the measured
values (min–max, median) and the points each answer earned.

    .venv/bin/python tools/measure/lab06_attention.py --runs 5 [--modes full,smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
from collections.abc import Callable

import torch

from ptcourse.core import measure, smoke
from ptcourse.grading import checks
from ptcourse.labs import lab06_attention as lab

ANSWERS = {"reference": lab.reference_sdpa, "baseline": lab.baseline_attention}
ROWS: dict[str, Callable[..., float]] = {
    "speedup": lab.check_speed,
    "peak_memory": lab.check_memory,
}


def graded(check: Callable[..., float], answer: lab.Attention) -> checks.Result:
    """The result ``check`` recorded for ``answer`` (its printed lines swallowed)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(checks.CheckFailed):
        check(answer, points=1)
    return checks.RESULTS[-1]


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}–{max(values):.3g}, median {statistics.median(values):.3g}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="full,smoke")
    args = parser.parse_args()
    measure.rss_follows_tensors()  # before any big tensor passes through the heap
    torch.set_num_threads(1)
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes.split(","):
            smoke.set_smoke(mode == "smoke")
            found = {(row, who): [] for row in ROWS for who in ANSWERS}
            for _ in range(args.runs):
                for row, check in ROWS.items():
                    for who, answer in ANSWERS.items():
                        found[row, who].append(graded(check, answer))
            print(f"== lab 06, {mode} mode, {args.runs} runs ({lab.sizes()})")
            for (row, who), results in found.items():
                points = ", ".join(f"{r.points:g}" for r in results)
                print(f"{row:<12} {who:<9} {spread([r.value for r in results])}; points {points}")
                print(f"{'':<22} last run: {results[-1].message.splitlines()[-1].strip()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
