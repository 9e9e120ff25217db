"""Measure what lab 06's target rows grade, through the graders' own checks.

For each run and each mode (full, smoke), ``check_speed`` and ``check_memory`` of
``ptcourse.labs.lab06_attention`` grade the reference solution (``reference_sdpa``, one call of
``F.scaled_dot_product_attention``) and a baseline-equivalent answer (``baseline_attention``, the
naive attention pasted as the SDPA exercise), on fresh secret inputs, with one torch thread and
a busy-loop process keeping the other core loaded. Prints, per row, the spread of the measured
values (min–max, median) and the points each answer earned.

    .venv/bin/python tools/measure/lab06_attention.py --runs 5 [--modes full,smoke]

``--blockwise`` grades Exercise 2's memory row instead (``check_blockwise_memory``): the
reference ``reference_blockwise`` and the naive attention pasted as the blockwise answer.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from reporting import graded, print_rows

from ptcourse.core import measure, smoke
from ptcourse.grading import checks
from ptcourse.labs import lab06_attention as lab

ANSWERS = {"reference": lab.reference_sdpa, "baseline": lab.baseline_attention}
CHECKS: tuple[Callable[..., float], ...] = (lab.check_speed, lab.check_memory)
BLOCKWISE = {"reference": lab.reference_blockwise, "baseline": lab.baseline_attention}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="full,smoke")
    parser.add_argument("--blockwise", action="store_true", help="Exercise 2's memory row")
    args = parser.parse_args()
    answers, rows = (
        (BLOCKWISE, (lab.check_blockwise_memory,)) if args.blockwise else (ANSWERS, CHECKS)
    )
    measure.rss_follows_tensors()  # before any big tensor passes through the heap
    torch.set_num_threads(1)
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes.split(","):
            smoke.set_smoke(mode == "smoke")
            found: dict[tuple[str, str], list[checks.Result]] = {}
            for _ in range(args.runs):
                for check in rows:
                    for who, answer in answers.items():
                        for result in graded(check, answer, points=1):
                            found.setdefault((result.check, who), []).append(result)
            print(f"== lab 06, {mode} mode, {args.runs} runs ({lab.sizes()})")
            print_rows(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
