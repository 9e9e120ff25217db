"""Measure what lab 12's target row grades, through the graders' own check.

    .venv/bin/python tools/measure/lab12_torch_compile.py --runs 5 [--full]

``inference_speedup``: each run calls ``fresh("12").check_inference_speed(answer, points=4)``
exactly as the hidden test cell does (a fresh secret scorer and fresh images every time, one
thread), alternating the reference solution (the solution notebook's ``inference`` cell:
``torch.compile`` with freezing, called in inference mode) and the grading tier's
baseline-equivalent (``tests/integration/submissions/lab12.py``: the eager scorer returned as
is), while a busy loop keeps the other core loaded. The value of a run is the speedup the check
recorded; its last line also shows what ``ReferenceCompiled`` reached in the same run.

Before the runs it prints what the notebook's section 2 measures: the pointwise chain's cold and
warm compile and its steady-state speedup (not graded; the numbers the lab's text rests on).
Smoke sizes always; ``--full`` adds the full ones.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from reporting import graded, print_rows

from ptcourse.core import hardware, measure
from ptcourse.core.smoke import set_smoke
from ptcourse.grading import checks
from ptcourse.labs import fresh
from ptcourse.labs import lab12_torch_compile as compile_lab

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "12-torch-compile" / "12-torch-compile.ipynb"
BASELINE = ROOT / "tests" / "integration" / "submissions" / "lab12.py"
EXERCISE = "inference"


def answer_from(source: str) -> Callable[[Any], Any]:
    space: dict[str, Any] = {"torch": torch, "lab": compile_lab}
    exec(compile(source, f"<{EXERCISE}>", "exec"), space)
    return space["compile_for_inference"]


def reference_answer() -> Callable[[Any], Any]:
    cells = json.loads(SOLUTION.read_text())["cells"]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}
    return answer_from(by_id[EXERCISE])


def baseline_answer() -> Callable[[Any], Any]:
    return answer_from(runpy.run_path(str(BASELINE))["VARIANT"]["students"]["baseline"][EXERCISE])


def chain_costs() -> None:
    s = compile_lab.sizes()
    args = compile_lab.chain_inputs(s.chain_numel, torch.Generator().manual_seed(0))
    costs = compile_lab.compile_costs(compile_lab.pointwise_chain, args, budget_s=s.time_budget_s)
    print(f"pointwise chain, {s.chain_numel:,} elements:\n{costs.table()}")


def measure_mode(full: bool, runs: int, answers: dict[str, Callable]) -> None:
    set_smoke(not full)
    print(f"\n== {'full' if full else 'smoke'}, track {compile_lab.compiles_here().name}")
    chain_costs()
    found: dict[tuple[str, str], list[checks.Result]] = {}
    for _ in range(runs):
        for who, answer in answers.items():
            for result in graded(fresh("12").check_inference_speed, answer, points=4):
                found.setdefault((result.check, who), []).append(result)
    print_rows(found)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per answer")
    parser.add_argument("--full", action="store_true", help="also measure at full sizes")
    args = parser.parse_args(argv)
    os.environ.pop(checks.SEED_ENV, None)  # a fresh secret scorer every run, as in grading
    os.environ.pop("PTCOURSE_TRACK", None)
    print(f"C++ compiler: {hardware.cxx_compiler()}")
    answers = {"reference": reference_answer(), "baseline-equivalent": baseline_answer()}
    with measure.busy_cores(1, max_seconds=7200):
        for full in (False, True) if args.full else (False,):
            measure_mode(full, args.runs, answers)


if __name__ == "__main__":
    main()
