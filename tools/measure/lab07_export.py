"""Measure what lab 07's target row grades, through the graders' own check.

    .venv/bin/python tools/measure/lab07_export.py --runs 3 [--full]

``ort_latency``: each run calls ``fresh("07").check_speed(ort_runner, onnx_model, points=1)``
exactly as the hidden test cell does (a fresh secret input every time, one thread), alternating
the reference solution (the solution notebook's ``export_exercise`` cell: dynamo export with a
dynamic batch, an ONNX Runtime session with one thread and spinning off) and the grading tier's
baseline-equivalent (``tests/integration/submissions/lab07.py``: eager PyTorch pasted in as the
"runner"), while a busy loop keeps the other core loaded. Each answer exports the notebook's
classifier once, as the notebook does, before the runs. The value of a run is the speedup the
check recorded (``checks.RESULTS``).

Smoke timing settings (what the grading tier runs) always; ``--full`` adds the full ones (the
graded input is the same: only ``measure.compare``'s sampling budget and block length change).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

from ptcourse.assets import onnx_runtime
from ptcourse.core import hardware, measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import set_smoke
from ptcourse.grading import checks
from ptcourse.labs import fresh
from ptcourse.labs import lab07_export as export

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "07-export" / "07-export.ipynb"
BASELINE = ROOT / "tests" / "integration" / "submissions" / "lab07.py"
EXERCISE = "export_exercise"


def exported(source: str) -> tuple[Any, Any]:
    """Run the exercise cell ``source`` as the notebook does: (ort_runner, onnx_model)."""
    space: dict[str, Any] = {"torch": torch, "onnx_runtime": onnx_runtime, "lab": export}
    exec(compile(source, f"<{EXERCISE}>", "exec"), space)
    s = export.sizes()
    classifier = export.inspection_classifier(seed=0)
    example = export.images(s.export_batch, s.image, generator=torch.Generator().manual_seed(0))
    with captured_stderr():
        onnx_model = space["export_onnx"](classifier, example)
    return space["ort_runner"], onnx_model


def reference_answer() -> tuple[Any, Any]:
    cells = json.loads(SOLUTION.read_text())["cells"]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}
    return exported(by_id[EXERCISE])


def baseline_answer() -> tuple[Any, Any]:
    return exported(runpy.run_path(str(BASELINE))["VARIANT"]["students"]["baseline"][EXERCISE])


def one_run(answer: tuple[Any, Any], verbose: bool) -> tuple[float, float]:
    """(speedup the check measured, points out of 1) for one hidden-cell run of check_speed."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stdout if verbose else said):
            points = fresh("07").check_speed(*answer, points=1)
    except checks.CheckFailed:
        points = 0.0
    return checks.RESULTS[-1].value, points


def spread(values: list[float]) -> str:
    return (
        f"median {statistics.median(values):.3g}, {min(values):.3g}–{max(values):.3g} "
        f"({', '.join(f'{v:.3g}' for v in values)})"
    )


def measure_mode(full: bool, runs: int, answers: dict[str, tuple], verbose: bool) -> None:
    set_smoke(not full)
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in answers}
    for _ in range(runs):
        for name, answer in answers.items():
            results[name].append(one_run(answer, verbose))
    track = hardware.track_for(export.LAB).name
    print(f"\n== ort_latency, {'full' if full else 'smoke'}, track {track}, {runs} runs each")
    for name, pairs in results.items():
        values, points = [v for v, _ in pairs], [p for _, p in pairs]
        print(f"  {name:<22} {spread(values)}; points/1: {', '.join(f'{p:g}' for p in points)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per answer")
    parser.add_argument("--full", action="store_true", help="also measure at full settings")
    parser.add_argument("--verbose", action="store_true", help="print every check's own lines")
    args = parser.parse_args(argv)
    os.environ.pop(checks.SEED_ENV, None)  # a fresh secret input every run, as in grading
    os.environ.pop("PTCOURSE_TRACK", None)
    print(f"ONNX Runtime: {hardware.backend('onnxruntime')}")
    answers = {"reference": reference_answer(), "baseline-equivalent": baseline_answer()}
    with measure.busy_cores(1, max_seconds=7200):
        for full in (False, True) if args.full else (False,):
            measure_mode(full, args.runs, answers, args.verbose)


if __name__ == "__main__":
    main()
