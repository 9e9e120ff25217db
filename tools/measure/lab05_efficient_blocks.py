"""Measure what lab 05's target rows grade, through the lab's own checks.

``flops_ratio`` is graded by ``check_flops_ratio``; ``accuracy`` and ``accuracy_drop`` by
``check_accuracy`` (the student's block and the standard block trained with the same secret
seed). Each runs ``--runs`` times on the reference solution (the ``EfficientBlock`` of
``solutions/05-efficient-blocks``), on the baseline-equivalent answer (the standard block pasted
as the exercise, as ``tests/integration/submissions/lab05.py`` does) and, for the accuracy rows,
on a broken block (the reference block fed zeros: it ignores its input), one torch thread, with a
busy-loop process on the other core. Run ``i`` uses secret seed ``i``. It prints per row and
answer the graded value (median, min, max), how many runs earned full and zero credit, and the
runs a check failed before it graded the row::

    .venv/bin/python tools/measure/lab05_efficient_blocks.py --runs 3 [--smoke] [--verbose]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from ptcourse.core import lineup
from ptcourse.grading import checks
from ptcourse.labs import module

ROOT = Path(__file__).resolve().parents[2]
LAB = lineup.lab("05")
BUSY = "while True: pass"


def solution_block(lab: Any) -> type[nn.Module]:
    """The ``EfficientBlock`` the solution notebook defines."""
    notebook = ROOT / "solutions" / LAB.name / f"{LAB.name}.ipynb"
    for cell in json.loads(notebook.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "efficient_block":
            names: dict[str, Any] = {"nn": nn, "torch": torch, "blocks": lab}
            exec("".join(cell["source"]), names)
            return names["EfficientBlock"]
    raise KeyError(f"no efficient_block cell in {notebook}")


def answers(lab: Any) -> dict[str, type[nn.Module] | Callable[..., nn.Module]]:
    reference = solution_block(lab)

    class IgnoresInput(reference):  # type: ignore[misc, valid-type]
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(torch.zeros_like(x))

    return {"reference": reference, "baseline": lab.baseline_block, "broken": IgnoresInput}


def measure_once(
    grade: Callable[[], float], seed: int, verbose: bool
) -> tuple[dict[str, tuple[float, float]], str]:
    """({row: (value, points earned out of that row's share)}, failure before grading or "")."""
    os.environ[checks.SEED_ENV] = str(seed)
    before = len(checks.RESULTS)
    out = io.StringIO()
    failure = ""
    with contextlib.redirect_stdout(out):
        try:
            grade()
        except checks.CheckFailed as error:
            failure = str(error).splitlines()[0]
    if verbose:
        print(out.getvalue(), end="")
    graded = {r.check: (r.value, r.points / r.max_points) for r in checks.RESULTS[before:]}
    return graded, "" if graded else failure


def summary(values: list[float], earned: list[float], failures: list[str]) -> str:
    parts = []
    if values:
        parts.append(
            f"median {np.median(values):.3g}, min {min(values):.3g}, max {max(values):.3g} "
            f"over {len(values)} runs; full credit {sum(e >= 1 for e in earned)}, "
            f"zero {sum(e <= 0 for e in earned)}"
        )
    if failures:
        parts.append(f"{len(failures)} runs failed before this row: {sorted(set(failures))}")
    return "; ".join(parts)


def report(check: str, name: str, runs: list[tuple[dict[str, tuple[float, float]], str]]) -> None:
    """One line per row that ``check`` grades, for one answer."""
    for row in ROWS[check]:
        values = [graded[row][0] for graded, _ in runs if row in graded]
        earned = [graded[row][1] for graded, _ in runs if row in graded]
        failures = [
            failure or "not graded: an earlier row failed"
            for graded, failure in runs
            if row not in graded
        ]
        print(f"{row:13s} {name:9s} {summary(values, earned, failures)}", flush=True)


ROWS = {"flops_ratio": ("flops_ratio",), "accuracy": ("accuracy", "accuracy_drop")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="smoke inspection set (as tests)")
    parser.add_argument("--verbose", action="store_true", help="print every check's own lines")
    args = parser.parse_args()
    os.environ["PTCOURSE_SMOKE"] = "1" if args.smoke else "0"
    os.environ.pop(checks.RESULTS_ENV, None)
    torch.set_num_threads(1)
    lab = module("05")
    blocks = answers(lab)
    graders = {"flops_ratio": lab.check_flops_ratio, "accuracy": lab.check_accuracy}
    print(f"lab 05, {'smoke' if args.smoke else 'full'} set, {args.runs} runs per answer")
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        for check, grade in graders.items():
            for name, block in blocks.items():
                if check == "flops_ratio" and name == "broken":
                    continue

                def run(grade: Callable[..., float] = grade, block: Any = block) -> float:
                    return grade(block, points=2)

                report(check, name, [measure_once(run, s, args.verbose) for s in range(args.runs)])
    finally:
        busy.kill()
        busy.wait()


if __name__ == "__main__":
    main()
