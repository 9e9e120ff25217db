"""Measure what lab 10's target rows grade, through the lab's own checks.

    .venv/bin/python tools/measure/lab10_quantization.py --runs 5 [--modes full smoke]
        [--also-torchao]
    .venv/bin/python tools/measure/lab10_quantization.py --by-hand --runs 5

``--by-hand`` grades Exercise 1 instead (``check_quantize``, ``check_fake_linear``): the
solution notebook's ``quantize_per_channel``, ``dequantize`` and ``fake_quant_linear``, and the
wrong answers the rows' baseline columns name (truncation instead of rounding; one per-tensor
scale; no quantization at all), on seeds 0..runs-1.

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


def solution(grade_id: str, name: str | None = None) -> Callable:
    """The solution notebook's function ``name`` (default: ``grade_id``) defined in cell
    ``grade_id``, executed from its cell."""
    cells = json.loads(NOTEBOOK.read_text())["cells"]
    (source,) = [
        "".join(c["source"])
        for c in cells
        if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id
    ]
    namespace = {
        "copy": copy,
        "torch": torch,
        "nn": nn,
        "F": nn.functional,
        "captured_stderr": captured_stderr,
    }
    exec(source, namespace)
    return namespace[name or grade_id]


def by_hand(runs: int) -> None:
    """Exercise 1's rows: the reference and the wrong answers, ``runs`` seeds."""
    quant, deq, fake = (solution("int8_by_hand", name) for name in ("quantize_per_channel",
                        "dequantize", "fake_quant_linear"))  # fmt: skip

    def truncated(w):
        q, s = quant(w)
        return torch.clamp(w / s[:, None], -127, 127).to(torch.int8), s  # no rounding

    def per_tensor_fake(x, w, b):
        return nn.functional.linear(x, lab.reference_dequantize(*lab.per_tensor_quantize(w)), b)

    def fp32(x, w, b):
        return nn.functional.linear(x, w, b)

    rows = {
        "quantize_error": {"reference": (lab.check_quantize, (quant, deq)),
                           "truncation": (lab.check_quantize, (truncated, deq))},
        "fake_linear_error": {"reference": (lab.check_fake_linear, (fake,)),
                              "per-tensor": (lab.check_fake_linear, (per_tensor_fake,)),
                              "fp32": (lab.check_fake_linear, (fp32,))},
    }  # fmt: skip
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in range(runs):
        os.environ[checks.SEED_ENV] = str(run)
        for row, answers in rows.items():
            for who, (check, args) in answers.items():
                before = len(checks.RESULTS)
                try:
                    with contextlib.redirect_stdout(None):
                        check(*args, points=1)
                except checks.CheckFailed as failed:
                    if len(checks.RESULTS) == before:
                        values[row][who].append(f"failed before the row: {str(failed)[:90]}")
                        continue
                values[row][who].append(checks.RESULTS[-1].value)
    for row, whos in values.items():
        for who, vals in whos.items():
            nums = [v for v in vals if isinstance(v, float)]
            text = spread(nums) if nums else vals[0]
            print(f"  {row:<19} {who:<12} {text}")


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
    parser.add_argument("--by-hand", action="store_true", help="Exercise 1's rows only")
    args = parser.parse_args()
    os.environ["PTCOURSE_TRACK"] = "cpu"
    torch.set_num_threads(1)
    if args.by_hand:
        by_hand(args.runs)
        return
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
