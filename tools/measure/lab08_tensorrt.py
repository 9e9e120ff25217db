"""Measure what lab 08's target rows grade: the reference solution and a baseline-equivalent
answer, ``--runs`` times each, through the lab's own graders, one thread, with a busy neighbour
process (``measure.busy_cores``).

    .venv/bin/python tools/measure/lab08_tensorrt.py --runs 5            # full size
    .venv/bin/python tools/measure/lab08_tensorrt.py --runs 5 --smoke    # smoke size

The reference answers are the solution cells of ``solutions/08-tensorrt/08-tensorrt.ipynb``
(executed here); the baseline-equivalent answers are the lab's ``baseline_fuse_conv_bn`` (the
model unfolded) and ``baseline_to_bf16`` (an fp32 copy). The fusion check rejects an unfolded
model before timing it (BatchNorm left), so the baseline's latency is timed with the check's
own inputs and timing code (``fusion_speed_case`` + ``grade_fusion_latency``, which times the
lab's ``reference_fuse_conv_bn`` in the same run and grades relative to it; each run also
reports that reference's speedup and whether speed was gradable), and ``bn_folded`` (what
the points grade where it is not) through ``grade_bn_folded``. Each run draws a fresh secret
seed. ``engine_speedup`` (shown in the notebook, not graded) times ONNX Runtime
at level "all" against eager PyTorch as the notebook does.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "solutions" / "08-tensorrt" / "08-tensorrt.ipynb"
ROWS = (
    "fusion_latency",
    "bn_folded",
    "bf16_accuracy_change",
    "bf16_in_effect",
    "bf16_speed",
    "engine_speedup",
)


def reference_answers() -> dict[str, Any]:
    """The notebook's solution cells, executed: fold_bn, fuse_conv_bn, optimized_session and
    to_bf16 in one namespace."""
    import copy

    import torch
    from torch import nn

    from ptcourse.assets import onnx_runtime

    namespace: dict[str, Any] = {"copy": copy, "torch": torch, "nn": nn,
                                 "onnx_runtime": onnx_runtime}  # fmt: skip
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        solution = cell.get("metadata", {}).get("nbgrader", {}).get("solution")
        if solution and cell["cell_type"] == "code":
            exec("".join(cell["source"]), namespace)
    return namespace


REFERENCE_HERE = re.compile(r"reference solution here ([0-9.]+)x")


def graded(run: Callable[[], float]) -> tuple[float, float, str, str]:
    """(value the check recorded, points, its first printed line, all it printed) of one check
    call. A relative speed check that found speed not gradable records its fallback's value."""
    from ptcourse.grading import checks

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            points = run()
        except checks.CheckFailed:
            points = 0.0
    text = out.getvalue().strip()
    return checks.RESULTS[-1].value, points, (text.splitlines() or [""])[0], text


def relative(results: list[tuple[float, float, str, str]]) -> None:
    """For a relative speed check: the reference's speedup each run and how many runs could
    grade speed (the others graded the fallback row; their values are that row's)."""
    refs = [float(m.group(1)) for *_, text in results if (m := REFERENCE_HERE.search(text))]
    fallback = sum("not gradable" in text for *_, text in results)
    if refs:
        print(f"{'':<21} {'reference':<9} here {summary(refs)}; speed not gradable in {fallback} "
              f"of {len(results)} runs", flush=True)  # fmt: skip


def summary(values: list[float]) -> str:
    return (f"{min(values):.3g}–{max(values):.3g}, median {statistics.median(values):.3g} "
            f"({len(values)} runs)")  # fmt: skip


def measure_row(row: str, runs: int, answers: dict[str, Any]) -> None:
    from ptcourse.grading import checks
    from ptcourse.labs import lab08_tensorrt as lab

    def fusion(fuse: Callable[[Any], Any]) -> Callable[[], float]:
        def run() -> float:
            net, xs = lab.fusion_speed_case(checks.secret_seed())
            return lab.grade_fusion_latency(net, fuse(net), xs, points=3)

        return run

    def folded(fuse: Callable[[Any], Any]) -> Callable[[], float]:
        def run() -> float:
            net, xs = lab.fusion_speed_case(checks.secret_seed())
            return lab.grade_bn_folded(net, fuse(net), xs, points=3)

        return run

    def in_effect(convert: Callable[[Any], Any]) -> Callable[[], float]:
        def run() -> float:
            seed = checks.secret_seed()
            return lab.grade_bf16_in_effect(convert(lab.deployed_model(seed)), seed, points=2)

        return run

    def bf16_speed(convert: Callable[[Any], Any]) -> Callable[[], float]:
        def run() -> float:
            seed = checks.secret_seed()
            net = lab.deployed_model(seed)
            return lab.grade_bf16_speed(net, convert(net), seed, points=2)

        return run

    def engine(use_ort: bool) -> Callable[[], float]:
        def run() -> float:
            import torch

            from ptcourse.assets import onnx_runtime
            from ptcourse.grading import targets

            side = lab.sizes().image
            net = lab.deployed_model(0)
            x = torch.randn(1, 3, side, side)
            sess = answers["optimized_session"](lab.exported_deployed(0, side), "all", os.devnull)
            fast = (lambda: onnx_runtime.run(sess, x)) if use_ort else (lambda: net(x))
            goal = targets.goal(lab.TARGETS, "engine_speedup")
            with torch.inference_mode():  # as the notebook's cell times it, graded like a check
                return checks.speedup(goal, lambda: net(x), fast, points=1)

        return run

    cases: dict[str, tuple[Callable[[], float], Callable[[], float]]] = {
        "fusion_latency": (fusion(answers["fuse_conv_bn"]), fusion(lab.baseline_fuse_conv_bn)),
        "bn_folded": (folded(answers["fuse_conv_bn"]), folded(lab.baseline_fuse_conv_bn)),
        "bf16_accuracy_change": (
            lambda: lab.check_bf16_accuracy(answers["to_bf16"], points=2),
            lambda: lab.check_bf16_accuracy(lab.baseline_to_bf16, points=2),
        ),
        "bf16_in_effect": (in_effect(answers["to_bf16"]), in_effect(lab.baseline_to_bf16)),
        "bf16_speed": (bf16_speed(answers["to_bf16"]), bf16_speed(lab.baseline_to_bf16)),
        "engine_speedup": (engine(True), engine(False)),
    }
    for who, run in zip(("reference", "baseline"), cases[row], strict=True):
        results = [graded(run) for _ in range(runs)]
        values = [value for value, *_ in results]
        points = [earned for _, earned, *_ in results]
        print(f"{row:<21} {who:<9} {summary(values)}; points {summary(points)}", flush=True)
        print(f"{'':<21} {'each':<9} {', '.join(f'{v:.3g}' for v in values)}", flush=True)
        relative(results)
        for name, pick in (("lowest", min), ("highest", max)):
            print(f"{'':<21} {name:<9} {pick(results)[2]}", flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="smoke-size dataset and budgets")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {ROWS}")
    args = parser.parse_args(argv)
    os.environ["PTCOURSE_SMOKE"] = "1" if args.smoke else "0"
    os.environ.pop("PTCOURSE_SECRET_SEED", None)  # a fresh seed every run
    import torch

    from ptcourse.core import hardware, measure

    torch.set_num_threads(1)
    print(f"lab 08, {'smoke' if args.smoke else 'full'}, {args.runs} runs; fast bf16: "
          f"{hardware.has('fast_bf16')}; torch {torch.__version__}", flush=True)  # fmt: skip
    answers = reference_answers()
    with measure.busy_cores(1, max_seconds=7200):
        for row in args.rows.split(","):
            measure_row(row, args.runs, answers)


if __name__ == "__main__":
    sys.exit(main())
