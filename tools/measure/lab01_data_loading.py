"""Measure what Lab 01's target row grades, through the grader's own check.

Row "throughput": ``check_speed`` (images/s of a freshly built cache + ``cached_batches`` over the
baseline loader, interleaved, one thread) on

- the reference: the notebook's solution cells (``build_cache``, ``augment_batch``,
  ``cached_batches``), run from ``solutions/01-data-loading/01-data-loading.ipynb``;
- a baseline-equivalent answer: ``cached_batches`` that iterates the baseline loader over the
  JPEGs (as ``tests/integration/submissions/lab01.py`` hands in), with the reference cache.

Row "loop_timing": ``check_loop_timing`` (the relative error of a loop's per-step wait/compute
split against sleeps of secret length) on the notebook's ``wait_and_compute`` and on a
baseline-equivalent split that times each whole iteration as compute (``lumped``), a fresh secret
seed per run.

N runs of each, alternating, in full and/or smoke mode, with one torch thread and a busy-loop
process on another core (the load every target was set against). Prints one line per run and a
summary per row and mode::

    .venv/bin/python tools/measure/lab01_data_loading.py --runs 5 [--mode full|smoke|both]
    .venv/bin/python tools/measure/lab01_data_loading.py --row loop_timing --runs 10
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
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ptcourse.assets import datasets, loaders
from ptcourse.core import measure
from ptcourse.core.smoke import ENV_VAR
from ptcourse.grading import checks
from ptcourse.labs import lab01_data_loading as lab01

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "solutions" / "01-data-loading" / "01-data-loading.ipynb"
EXERCISES = ("build_cache", "augment_batch", "cached_batches", "wait_and_compute")


def solution() -> SimpleNamespace:
    """The notebook's answers, run from its solution cells."""
    namespace = {"torch": torch, "F": F, "loaders": loaders, "time": time}
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") in EXERCISES:
            exec("".join(cell["source"]), namespace)
    return SimpleNamespace(**{name: namespace[name] for name in EXERCISES})


def baseline_batches(images, labels, batch_size, generator, device="cpu"):
    """Baseline-equivalent ``cached_batches``: the baseline DataLoader over the JPEG files."""
    yield from loaders.baseline_loader(datasets.inspection_splits()[0], batch_size)


def lumped(batches, step, steps):
    """Baseline-equivalent split: one clock around each whole iteration, reported as compute."""
    waits, computes = [], []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(batches)
        step(x, y)
        waits.append(0.0)
        computes.append(time.perf_counter() - start)
    return waits, computes


def measure_loop_timing(runs: int, answer: SimpleNamespace) -> None:
    answers = {"reference": answer.wait_and_compute, "baseline": lumped}
    errors: dict[str, list[float]] = {name: [] for name in answers}
    for run in range(runs):
        for name, split in answers.items():
            result = graded(lambda split=split: lab01.check_loop_timing(split, points=1))
            errors[name].append(result.value)
            print(
                f"run {run + 1}/{runs} {name:9s}: error {result.value:.4f}, "
                f"{result.points:g}/1 points",
                flush=True,
            )
    row = next(row for row in lab01.TARGETS if row.check == "loop_timing")
    for name, values in errors.items():
        print(
            f"[loop_timing] {name}: {min(values):.4f}–{max(values):.4f} (median "
            f"{statistics.median(values):.4f}, {len(values)} runs); target {row.target:g}, "
            f"zero credit at {row.floor:g}"
        )


def graded(check: Callable[[], float]) -> checks.Result:
    """Run one check with its printing silenced; the result it recorded."""
    # a zero raises CheckFailed, recorded all the same
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(checks.CheckFailed):
        check()
    return checks.RESULTS[-1]


def measure_mode(mode: str, runs: int, answer: SimpleNamespace) -> dict[str, list[float]]:
    os.environ[ENV_VAR] = "1" if mode == "smoke" else "0"
    answers = {
        "reference": lambda: lab01.check_speed(answer.build_cache, answer.cached_batches, points=4),
        "baseline": lambda: lab01.check_speed(answer.build_cache, baseline_batches, points=4),
    }
    ratios: dict[str, list[float]] = {name: [] for name in answers}
    for run in range(runs):
        for name, check in answers.items():
            result = graded(check)
            ratios[name].append(result.value)
            print(
                f"{mode} run {run + 1}/{runs} {name:9s}: {result.value:.2f}x (95% CI "
                f"{result.ci_low:.2f}–{result.ci_high:.2f}x), {result.points:g}/4 points",
                flush=True,
            )
    return ratios


def summary(mode: str, ratios: dict[str, list[float]]) -> None:
    row = lab01.TARGETS[0]
    for name, values in ratios.items():
        print(
            f"[{row.check} · {mode}] {name}: {min(values):.2f}–{max(values):.2f}x "
            f"(median {statistics.median(values):.2f}x, {len(values)} runs); "
            f"target {row.target:g}x, zero credit at {row.floor:g}x"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--mode", choices=("full", "smoke", "both"), default="both")
    parser.add_argument("--row", choices=("throughput", "loop_timing"), default="throughput")
    args = parser.parse_args(argv)
    os.environ.pop(checks.SEED_ENV, None)  # a fresh secret seed every run, as in grading
    torch.set_num_threads(1)
    answer = solution()
    if args.row == "loop_timing":
        with measure.busy_cores(1, max_seconds=7200):
            measure_loop_timing(args.runs, answer)
        return
    modes = ("full", "smoke") if args.mode == "both" else (args.mode,)
    results = {}
    with measure.busy_cores(1, max_seconds=7200):
        for mode in modes:
            results[mode] = measure_mode(mode, args.runs, answer)
    for mode, ratios in results.items():
        summary(mode, ratios)


if __name__ == "__main__":
    main()
