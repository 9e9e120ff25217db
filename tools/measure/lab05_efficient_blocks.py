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

``--plateau 1000,2000,4000`` instead trains the standard block and the reference block to a
plateau (``plateau_curve``: warm-up, cosine decay to zero) for each schedule length, on
``--seeds`` (else the ``PlateauSize`` of ``sizes()``: its seeds, batch, learning rate, warm-up
share and evaluation interval; ``--batch``, ``--lr`` and ``--every`` override them), and prints
per run the final test accuracy, the curve and the training time, then per length the table and
the verdict the notebook prints. It chose the notebook's recipe and length (the sweeps are in the
lab module, above ``sizes``): the length at which doubling it no longer raised either block's
mean accuracy by more than the spread between seeds::

    nice -n 10 .venv/bin/python tools/measure/lab05_efficient_blocks.py --plateau 2000,4000
    nice -n 10 .venv/bin/python tools/measure/lab05_efficient_blocks.py --plateau 500,1000,2000 \
        --batch 32 --lr 0.006
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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
            names: dict[str, Any] = {"nn": nn, "torch": torch, "lab": lab}
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


def plateau(lab: Any, lengths: list[int], seeds: tuple[int, ...] | None, args: Any) -> None:
    """The standard and the reference block trained to a plateau at each schedule length."""
    base = lab.sizes().plateau
    run = dataclasses.replace(
        base.train, batch=args.batch or base.train.batch, lr=args.lr or base.train.lr
    )
    named = {"standard": lab.baseline_block, "efficient": solution_block(lab)}
    for steps in lengths:
        size = dataclasses.replace(
            base,
            train=dataclasses.replace(run, steps=steps),
            seeds=seeds or base.seeds,
            every=args.every or base.every,
            warmup=round(steps * base.warmup / base.train.steps),
        )
        print(f"--- {steps} steps: {size}", flush=True)
        runs = {name: lab.train_to_plateau(name, block, size) for name, block in named.items()}
        found = lab.plateau_of(runs, size)
        for name, curves in found.curves.items():
            for seed, curve in zip(found.seeds, curves, strict=True):
                points = " ".join(
                    f"{s}:{a:.3f}" for s, a in zip(curve.steps, curve.accuracy, strict=True)
                )
                print(f"  {name} seed {seed} ({curve.seconds:.0f} s): {points}")
        print(lab.plateau_table(found))
        print(lab.claim_verdict(found.drops()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="smoke inspection set (as tests)")
    parser.add_argument("--verbose", action="store_true", help="print every check's own lines")
    parser.add_argument("--plateau", help="schedule lengths to train to a plateau, e.g. 300,600")
    parser.add_argument("--seeds", help="seeds of the plateau runs, e.g. 0,1,2")
    parser.add_argument("--every", type=int, default=0, help="evaluate every this many steps")
    parser.add_argument("--batch", type=int, default=0, help="plateau runs' batch size")
    parser.add_argument("--lr", type=float, default=0.0, help="plateau runs' peak learning rate")
    args = parser.parse_args()
    os.environ["PTCOURSE_SMOKE"] = "1" if args.smoke else "0"
    os.environ.pop(checks.RESULTS_ENV, None)
    torch.set_num_threads(1)
    lab = module("05")
    if args.plateau:
        seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else None
        plateau(lab, [int(n) for n in args.plateau.split(",")], seeds, args)
        return
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
