"""Measure what lab 00's target rows grade, through the lab's own checks.

For each row (``check_time_it_compute``, ``check_time_it_warmup``, ``check_time_it_async``,
``check_roofline``) it runs the check ``--runs`` times on the reference solution (the solution
cells of ``solutions/00-measuring-right``) and on a baseline-equivalent answer (the naive timer
:func:`~ptcourse.labs.lab00_measuring_right.baseline_time_it`; for the roofline, the released
lab's unanswered cells), one torch thread, with a busy-loop process on the other core. Run ``i``
uses secret seed ``i``. It prints the graded value per row: median, min and max for each answer,
and how many runs earned full and zero credit::

    .venv/bin/python tools/measure/lab00_measuring_right.py --runs 5 [--smoke] [--verbose]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ptcourse.core import lineup, measure
from ptcourse.grading import checks
from ptcourse.labs import module

ROOT = Path(__file__).resolve().parents[2]
LAB = lineup.lab("00")


def notebook_names(folder: str, grade_id: str) -> dict[str, Any]:
    """The names one cell of lab 00's notebook in ``folder`` (solutions or labs) defines."""
    notebook = ROOT / folder / LAB.name / f"{LAB.name}.ipynb"
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            names: dict[str, Any] = {"statistics": statistics, "time": time}
            exec("".join(cell["source"]), names)
            return names
    raise KeyError(f"no cell {grade_id!r} in {notebook}")


def answers(lab: Any) -> dict[str, dict[str, Callable[[int], float]]]:
    """For each check, how to grade the reference and the baseline answer (points → earned)."""
    solution_timer = notebook_names("solutions", "time_it")["time_it"]
    solution_roofline = notebook_names("solutions", "roofline")
    blank_roofline = notebook_names("labs", "roofline")

    def roofline(names: dict[str, Any]) -> Callable[[int], float]:
        fns = (names["matmul_intensity"], names["add_intensity"], names["bound"])
        return lambda points: lab.check_roofline(*fns, points=points)

    timers = {"reference": solution_timer, "baseline": lab.baseline_time_it}
    rows = {}
    for check in ("time_it_compute", "time_it_warmup", "time_it_async"):
        grade = getattr(lab, f"check_{check}")
        rows[check] = {
            name: (lambda points, grade=grade, timer=timer: grade(timer, points=points))
            for name, timer in timers.items()
        }
    rows["roofline"] = {
        "reference": roofline(solution_roofline),
        "baseline": roofline(blank_roofline),
    }
    return rows


def measure_once(grade: Callable[[int], float], seed: int, verbose: bool) -> tuple[float, float]:
    """(graded value, points earned out of 1) of one run with secret seed ``seed``."""
    os.environ[checks.SEED_ENV] = str(seed)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            earned = grade(1)
        except checks.CheckFailed:
            earned = 0.0
    if verbose:
        print(out.getvalue(), end="")
    return checks.RESULTS[-1].value, earned


def summary(values: list[float], earned: list[float]) -> str:
    full = sum(e >= 1 for e in earned)
    zero = sum(e <= 0 for e in earned)
    return (
        f"median {np.median(values):.3g}, min {min(values):.3g}, max {max(values):.3g} "
        f"over {len(values)} runs; full credit {full}, zero {zero}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="smoke sizes (as the tests grade)")
    parser.add_argument("--verbose", action="store_true", help="print every check's own lines")
    args = parser.parse_args()
    os.environ["PTCOURSE_SMOKE"] = "1" if args.smoke else "0"
    os.environ.pop(checks.RESULTS_ENV, None)
    torch.set_num_threads(1)
    lab = module("00")
    rows = answers(lab)
    print(f"lab 00, {'smoke' if args.smoke else 'full'} sizes, {args.runs} runs per answer")
    with measure.busy_cores(1, max_seconds=3600):
        for row in lab.TARGETS:
            relation = "≥" if row.higher_is_better else "≤"
            print(f"{row.check}: {row.kind} {relation} {row.target:g}, floor {row.floor:g}")
            for name, grade in rows[row.check].items():
                runs = [measure_once(grade, seed, args.verbose) for seed in range(args.runs)]
                values, earned = zip(*runs, strict=True)
                print(f"  {name:9s} {summary(list(values), list(earned))}", flush=True)


if __name__ == "__main__":
    main()
