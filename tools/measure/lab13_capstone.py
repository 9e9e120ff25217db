"""Measure what lab 13's target rows grade, through the graders' own checks.

    .venv/bin/python tools/measure/lab13_capstone.py --runs 5 [--full] [--agreement LOTS]

Each run calls ``fresh("13").check_findings`` and ``check_lot_speed`` exactly as the hidden test
cells do (fresh secret lots every time, one thread), alternating the reference solution (the
solution notebook's stage functions and ``inspect_lot``) and the grading tier's
baseline-equivalent (``tests/integration/submissions/lab13.py``: ``BaselineLine`` as the
answer), while a busy loop keeps the other core loaded. ``lot_speedup``'s last line also shows
what ``ReferenceLine`` reached in the same run.

``--agreement LOTS`` first runs LOTS full-size lots through the baseline line, the reference
line and a 1/8-scale decode (a student's likely variant) and prints how often their decisions
differ, the F1 drop of each against the baseline and the per-lot region IoU: the numbers
``Agreement`` and the F1 rule rest on. Smoke sizes always; ``--full`` adds the full ones.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import runpy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from reporting import graded, print_rows, spread

from ptcourse.core import measure
from ptcourse.core.smoke import set_smoke
from ptcourse.grading import checks
from ptcourse.labs import fresh
from ptcourse.labs import lab13_capstone as capstone

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "13-capstone" / "13-capstone.ipynb"
BASELINE = ROOT / "tests" / "integration" / "submissions" / "lab13.py"
EXERCISES = ("decode_small", "prepare", "fast_detector", "reports_from_maps", "inspect_lot")


def notebook_cells() -> dict[str, str]:
    cells = json.loads(SOLUTION.read_text())["cells"]
    return {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}


def answer_from(sources: dict[str, str]) -> Callable[..., Any]:
    """``inspect_lot`` as the notebook defines it, from the setup cell and the exercises."""
    space: dict[str, Any] = {}
    exec(compile(notebook_cells()["setup"], "<setup>", "exec"), space)
    space["baseline"] = capstone.BaselineLine()
    for name in EXERCISES:
        exec(compile(sources[name], f"<{name}>", "exec"), space)
        if name == "fast_detector" and "fast_detector" in space:
            space["DETECTOR"] = space["fast_detector"](capstone.models.inspection_detector())
    return space["inspect_lot"]


def reference_answer() -> Callable[..., Any]:
    return answer_from(notebook_cells())


def baseline_answer() -> Callable[..., Any]:
    replaced = runpy.run_path(str(BASELINE))["VARIANT"]["students"]["baseline"]
    return answer_from(notebook_cells() | replaced)


def eighth_scale(data: bytes) -> np.ndarray:
    image = Image.open(io.BytesIO(data))
    image.draft("RGB", (capstone.INPUT, capstone.INPUT))
    return np.asarray(image.convert("RGB"))


def agreement(lots: int) -> None:
    """Decisions, F1 and regions of the reference line and a 1/8 decode against the baseline."""
    set_smoke(False)
    size = capstone.sizes().lot
    baseline, reference = capstone.BaselineLine(), capstone.ReferenceLine()
    eighth = capstone.ReferenceLine()
    decisions: dict[str, list[bool]] = {"baseline": [], "reference": [], "1/8 decode": []}
    real: list[bool] = []
    ious: dict[str, list[float]] = {"reference": [], "1/8 decode": []}
    small = capstone.small_frame
    for number in range(lots):
        lot = capstone.inspection_lot(20261204, number, size)
        want = baseline(lot.frames)
        capstone.small_frame = eighth_scale
        try:
            got_eighth = eighth(lot.frames)
        finally:
            capstone.small_frame = small
        for name, reports in (("baseline", want), ("reference", reference(lot.frames)),
                              ("1/8 decode", got_eighth)):  # fmt: skip
            decisions[name] += [r["defective"] for r in reports]
            if name != "baseline":
                ious[name].append(capstone.region_iou(reports, want))
        real += [label > 0 for label in lot.labels]
    truth, base = np.asarray(real), np.asarray(decisions["baseline"])
    print(f"\n== agreement over {lots} lots of {size} frames ({len(real)} frames)")
    for name in ("reference", "1/8 decode"):
        mine = np.asarray(decisions[name])
        drop = capstone.f1_drop(base, mine, truth)
        differ = int((mine != base).sum())
        print(f"{name}: {differ} decisions differ from the baseline's; F1 {drop.line:.2f} vs "
              f"{drop.baseline:.2f} (drop {drop.drop:.2f}, 98% CI {drop.low:.2f}–"
              f"{drop.high:.2f}); region IoU per lot {spread(ious[name])}")  # fmt: skip
        for share in (128, 512):
            drops = [
                capstone.f1_drop(base[i : i + share], mine[i : i + share], truth[i : i + share])
                for i in range(0, len(real) - share + 1, share)
            ]
            lows = [d.low for d in drops]
            above = sum(v > 1 for v in lows)
            print(f"  per {share} frames: drop {spread([d.drop for d in drops])}; graded (low "
                  f"end) {spread(lows)}; above 1 point in {above} of {len(lows)}")  # fmt: skip


def measure_mode(full: bool, runs: int, answers: dict[str, Callable]) -> None:
    set_smoke(not full)
    print(f"\n== {'full' if full else 'smoke'}: lots of {capstone.sizes().lot} frames")
    found: dict[tuple[str, str], list[checks.Result]] = {}
    for _ in range(runs):
        for who, answer in answers.items():
            for check in (fresh("13").check_findings, fresh("13").check_lot_speed):
                for result in graded(check, answer, points=4):
                    found.setdefault((result.check, who), []).append(result)
    print_rows(found)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per answer")
    parser.add_argument("--full", action="store_true", help="also measure at full sizes")
    parser.add_argument("--agreement", type=int, default=0, help="full-size lots to compare")
    args = parser.parse_args(argv)
    os.environ.pop(checks.SEED_ENV, None)  # fresh secret lots every run, as in grading
    torch.set_num_threads(1)
    answers = {"reference": reference_answer(), "baseline-equivalent": baseline_answer()}
    with measure.busy_cores(1, max_seconds=7200):
        if args.agreement:
            agreement(args.agreement)
        for full in (False, True) if args.full else (False,):
            measure_mode(full, args.runs, answers)


if __name__ == "__main__":
    main()
