"""Measure what lab 10's target rows grade, through the lab's own checks.

    .venv/bin/python tools/measure/lab10_quantization.py --runs 5 [--modes full smoke]
        [--also-torchao]

For each mode (full and smoke data; the classifier is the same) and each run (secret seed = run
number) it grades the reference solution (the ``torchao_int8`` and ``fast_int8`` cells of the
solution notebook) and a baseline-equivalent answer (an unquantized copy of the float model, as
``tests/integration/submissions/lab10.py`` submits) with ``check_torchao``, ``check_fast_size``
and ``check_fast_speed`` of ``ptcourse.labs.lab10_quantization`` — one torch thread, a busy-loop
process on another core — and prints, per target row, what each answer measured.
``--also-torchao`` also grades torchao's int8 dynamic model as a ``fast_int8`` answer (which
scheme is fast depends on the CPU's int8 instructions).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import torch
from reporting import spread
from torch import nn

from ptcourse.core import hardware, measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.grading import checks
from ptcourse.labs import lab10_quantization as lab

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "solutions" / "10-quantization" / "10-quantization.ipynb"
ROWS = ("torchao_size", "fast_size", "fast_accuracy_drop", "fast_speedup")


def solution(grade_id: str) -> Callable[[nn.Module], nn.Module]:
    """The solution notebook's function defined in cell ``grade_id``, executed from its cell."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id
    ]
    namespace = {"copy": copy, "torch": torch, "nn": nn, "captured_stderr": captured_stderr}
    exec(source, namespace)
    return namespace[grade_id]


def float_copy(model: nn.Module) -> nn.Module:
    """The baseline-equivalent answer: the float model, unquantized."""
    return copy.deepcopy(model)


def graded(check: Callable[..., float], answer: Callable, points: float) -> dict[str, float]:
    """Run one check; the value it measured for each row it graded (a failure included)."""
    before = len(checks.RESULTS)
    with contextlib.redirect_stdout(None), contextlib.suppress(checks.CheckFailed):
        check(answer, points=points)
    return {r.check: r.value for r in checks.RESULTS[before:]}


def one_run(answers: dict[str, dict[str, Callable]]) -> dict[str, dict[str, float]]:
    values: dict[str, dict[str, float]] = defaultdict(dict)
    for who, answer in answers.items():
        if "torchao_int8" in answer:
            values[who] |= graded(lab.check_torchao, answer["torchao_int8"], 2)
        values[who] |= graded(lab.check_fast_size, answer["fast_int8"], 1)
        values[who] |= graded(lab.check_fast_speed, answer["fast_int8"], 4)
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--modes", nargs="+", choices=("full", "smoke"), default=["full", "smoke"])
    parser.add_argument("--also-torchao", action="store_true")
    args = parser.parse_args()
    os.environ["PTCOURSE_TRACK"] = "cpu"
    torch.set_num_threads(1)
    flags = [flag for flag in hardware.cpu_flags() if flag in hardware.INT8_FLAGS]
    print(f"CPU {hardware.machine().cpu_model}; int8 flags {', '.join(flags) or 'none'}; "
          f"torch kernels {torch.backends.cpu.get_cpu_capability()}")  # fmt: skip
    answers = {
        "reference": {"torchao_int8": solution("torchao_int8"), "fast_int8": solution("fast_int8")},
        "float copy": {"torchao_int8": float_copy, "fast_int8": float_copy},
    }
    if args.also_torchao:
        answers["torchao as fast_int8"] = {"fast_int8": solution("torchao_int8")}
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes:
            os.environ["PTCOURSE_SMOKE"] = "1" if mode == "smoke" else "0"
            with captured_stderr():
                lab.baseline_classifier()  # trains and caches on first use
            rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
            for run in range(args.runs):
                os.environ[checks.SEED_ENV] = str(run)
                for who, values in one_run(answers).items():
                    for row, value in values.items():
                        rows[row][who].append(value)
                print(f"{mode} run {run}: " + "; ".join(
                    f"{who} {row} {vals[-1]:.3g}" for row in ROWS for who, vals in rows[row].items()
                ), flush=True)  # fmt: skip
            print(f"{mode} data, 1 thread, other core loaded, {args.runs} runs:")
            for row in ROWS:
                for who, vals in rows[row].items():
                    print(f"  {row:<19} {who:<21} {spread(vals)}")


if __name__ == "__main__":
    main()
