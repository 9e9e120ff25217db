"""Measure what lab 11's target rows grade, through the graders' own checks.

For each run and each mode (full, smoke; the model and traces are the same, the curve's timing
budget is not):

- the **batch-size curve** of ``build_model`` (``measure_curve``): t(1), the peak batching gain
  (peak throughput x t(1)), the knee, and whether the heavy load is gradable here;
- ``heavy_load`` and ``light_load``: ``check_heavy_load`` / ``check_light_load`` grade the
  reference policy (``reference_knobs``, ``reference_dispatch``), the baseline (batch 1, no
  wait) and "always a full batch", replayed on that run's curve (measured afresh per run);
- ``batched_speedup``: ``check_batched_speed`` grades ``reference_batched_predict`` and the
  per-request loop pasted as the answer (``per_request_predict``).

One torch thread, a busy-loop process keeping the other core loaded. Prints, per row, the spread
of the measured values (min–max, median) and the points each answer earned, and the spread of
the curve's numbers.

    .venv/bin/python tools/measure/lab11_batching.py --runs 5 [--modes full,smoke]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from reporting import graded, print_rows, spread

from ptcourse.core import measure, smoke
from ptcourse.grading import checks
from ptcourse.labs import lab11_batching as lab

POLICIES: dict[str, tuple[Any, Any]] = {
    "reference": (lab.reference_knobs, lab.reference_dispatch),
    "baseline": (lambda curve: lab.BASELINE_KNOBS, lab.baseline_dispatch),
    "full_batch": (lab.reference_knobs, lab.full_batch_dispatch),
}
PREDICTORS = {"reference": lab.reference_batched_predict, "baseline": lab.per_request_predict}


def one_run() -> tuple[dict[str, float], list[tuple[str, checks.Result]]]:
    lab._CURVES.clear()  # a fresh curve per run: its noise is part of what is measured
    curve = lab.grading_curve()
    rates = lab.throughputs(curve)
    facts = {
        "t1_ms": curve[1] * 1e3,
        "gain": max(rates.values()) * curve[1],
        "knee": float(lab.reference_knee(curve)),
        "heavy_gradable": float(lab.heavy_is_gradable(curve)),
    }
    found = []
    for who, policy in POLICIES.items():
        for check in (lab.check_heavy_load, lab.check_light_load):
            found += [(who, r) for r in graded(check, *policy)]
    for who, predict in PREDICTORS.items():
        found += [(who, r) for r in graded(lab.check_batched_speed, predict)]
    return facts, found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="full,smoke")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes.split(","):
            smoke.set_smoke(mode == "smoke")
            curves: dict[str, list[float]] = {}
            found: dict[tuple[str, str], list[checks.Result]] = {}
            for _ in range(args.runs):
                facts, results = one_run()
                for key, value in facts.items():
                    curves.setdefault(key, []).append(value)
                for who, result in results:
                    found.setdefault((result.check, who), []).append(result)
            print(f"== lab 11, {mode} mode, {args.runs} runs ({lab.sizes()})")
            for key, values in curves.items():
                print(f"curve {key:<15} {spread(values)}")
            print_rows(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
