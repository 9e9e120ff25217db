"""Measure what lab 02's target rows grade, through the graders' own check.

    .venv/bin/python tools/measure/lab02_dali.py --runs 3 [--full]

Each run calls ``fresh("02").check_speed(...)`` exactly as the hidden test cell does (fresh secret
seed every time, one thread), alternating the two answers, while a busy loop keeps the other core
loaded; the value of each run is what the check recorded (``checks.RESULTS``).

- ``throughput`` (track cpu, DALI installed; cuda where this runs on a GPU with DALI): the
  reference solution's ``inspection_pipeline`` (the solution notebook's cell) against the
  grading tier's baseline-equivalent one (``tests/integration/submissions/lab02.py``: Lab 01's
  per-sample PIL work inside DALI).
- ``tvio_equivalence`` (track cpu-basic, forced with ``PTCOURSE_TRACK``): the reference
  ``tvio_batch`` against the baseline-equivalent one (the PIL reference, one image at a time) and
  an unanswered exercise.

Smoke sizes (what the grading tier runs) always; ``--full`` adds the full sizes.
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

from ptcourse.assets import loaders
from ptcourse.core import hardware, measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import set_smoke
from ptcourse.grading import checks
from ptcourse.labs import fresh
from ptcourse.labs import lab02_dali as dali_pipeline

ROOT = Path(__file__).resolve().parents[2]
SOLUTION = ROOT / "solutions" / "02-dali" / "02-dali.ipynb"
BASELINE = ROOT / "tests" / "integration" / "submissions" / "lab02.py"
EXERCISES = ("tvio_batch", "inspection_pipeline", "dali_loader")


def notebook_namespace() -> dict[str, Any]:
    """The names the exercise cells use, as the notebook's setup and sizes cells define them."""
    space: dict[str, Any] = {
        "torch": torch,
        "loaders": loaders,
        "lab": dali_pipeline,
        "SPEC": loaders.SPEC,
        "SIZE": loaders.SPEC.size,
        "pipeline_def": dali_pipeline.missing_pipeline_def,
    }
    if dali_pipeline.available():
        with captured_stderr():
            from nvidia.dali import fn, pipeline_def, types
            from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy
        space.update(fn=fn, types=types, pipeline_def=pipeline_def)
        space.update(DALIGenericIterator=DALIGenericIterator, LastBatchPolicy=LastBatchPolicy)
    return space


def answers(sources: dict[str, str]) -> dict[str, Any]:
    """Run the exercise cells ``sources`` (grade id → source) and return what they define."""
    space = notebook_namespace()
    for grade_id in EXERCISES:
        exec(compile(sources[grade_id], f"<{grade_id}>", "exec"), space)
    return {name: space[name] for name in EXERCISES}


def reference_answers() -> dict[str, Any]:
    cells = json.loads(SOLUTION.read_text())["cells"]
    by_id = {c["metadata"].get("nbgrader", {}).get("grade_id"): "".join(c["source"]) for c in cells}
    return answers(by_id)


def baseline_answers() -> dict[str, Any]:
    return answers(runpy.run_path(str(BASELINE))["VARIANT"]["students"]["baseline"])


def unanswered(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError


def one_run(answer: dict[str, Any], verbose: bool) -> tuple[float, float]:
    """(value the check measured, points out of 1) for one hidden-cell run of check_speed."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(sys.stdout if verbose else said):
            points = fresh("02").check_speed(
                answer["inspection_pipeline"], answer["tvio_batch"], points=1
            )
    except checks.CheckFailed:
        points = 0.0
    except NotImplementedError:
        return float("nan"), 0.0
    return checks.RESULTS[-1].value, points


def spread(values: list[float]) -> str:
    numbers = [v for v in values if v == v]
    if not numbers:
        return "no value (raised)"
    return (
        f"median {statistics.median(numbers):.3g}, {min(numbers):.3g}–{max(numbers):.3g} "
        f"({', '.join(f'{v:.3g}' for v in values)})"
    )


def measure_row(row: str, candidates: dict[str, dict[str, Any]], runs: int, verbose: bool) -> None:
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in candidates}
    for _ in range(runs):
        for name, answer in candidates.items():
            results[name].append(one_run(answer, verbose))
    print(f"\n== {row}, track {dali_pipeline.track().name}, {runs} runs each")
    for name, pairs in results.items():
        values, points = [v for v, _ in pairs], [p for _, p in pairs]
        print(f"  {name:<22} {spread(values)}; points/1: {', '.join(f'{p:g}' for p in points)}")


def measure_mode(full: bool, runs: int, ours: dict, base: dict, verbose: bool) -> None:
    set_smoke(not full)
    print(f"\n#### {'full' if full else 'smoke'} sizes: {dali_pipeline.sizes()}")
    if dali_pipeline.runs_dali():
        rows = {"reference": ours, "baseline-equivalent": base}
        measure_row("throughput", rows, runs, verbose)
    else:
        print(f"throughput: not measurable here ({dali_pipeline.track().reason})")
    os.environ["PTCOURSE_TRACK"] = "cpu-basic"
    try:
        blank = dict.fromkeys(EXERCISES, unanswered)
        rows = {"reference": ours, "baseline-equivalent": base, "unanswered": blank}
        measure_row("tvio_equivalence", rows, runs, verbose)
    finally:
        del os.environ["PTCOURSE_TRACK"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="runs per answer and row")
    parser.add_argument("--full", action="store_true", help="also measure at full sizes")
    parser.add_argument("--verbose", action="store_true", help="print every check's own lines")
    args = parser.parse_args(argv)
    os.environ.pop(checks.SEED_ENV, None)  # a fresh secret seed every run, as in grading
    os.environ.pop("PTCOURSE_TRACK", None)
    print(f"machine: {measure.device_name()}, {hardware.usable_threads()} usable threads")
    print(f"DALI: {hardware.backend('dali')}")
    ours, base = reference_answers(), baseline_answers()
    with measure.busy_cores(1, max_seconds=7200):
        for full in (False, True) if args.full else (False,):
            measure_mode(full, args.runs, ours, base, args.verbose)


if __name__ == "__main__":
    main()
