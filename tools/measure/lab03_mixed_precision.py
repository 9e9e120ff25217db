"""Measure what Lab 03 grades on this machine, for the reference solution and the baseline.

    .venv/bin/python tools/measure/lab03_mixed_precision.py --runs 5 [--smoke] [--skip-speed]

Speed (rows ``text_step``/``image_step``): the reference bf16 autocast step and a copy of the
fp32 baseline, each against the fp32 baseline, in the graders' interleaved run. Scores (rows
``amp_step``, ``scaler``, ``*_autocast``, ``accuracy``): the graders' reports and the accuracy
run for the reference steps and the fp32 baseline, one secret seed per run. A busy-loop process
keeps the other core loaded, as on a shared grading machine.
"""

import argparse
import os
import statistics

import torch

from ptcourse.core import hardware, measure
from ptcourse.labs import lab03_mixed_precision as lab


def one_run(which: str, seed: int) -> tuple[float, float]:
    base, ref, copy, x, y = lab.timed_models(which, seed, copies=3)
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in (base, ref, copy)]
    timed = measure.compare_many(
        lambda: lab.baseline_step(base, opts[0], x, y),
        {
            "reference": lambda: lab.reference_step(ref, opts[1], x, y),
            "baseline copy": lambda: lab.baseline_step(copy, opts[2], x, y),
        },
    )
    return timed["reference"].ratio, timed["baseline copy"].ratio


def scores(seed: int) -> dict[str, tuple[float, float]]:
    """(reference, baseline) for each score row, with seed ``seed``."""
    base_scaled = lambda m, o, s, x, y: lab.baseline_step(m, o, x, y)  # noqa: E731
    fp32 = lab.train_run(lab.baseline_step, seed).accuracy
    bf16 = lab.train_run(lab.reference_step, seed).accuracy
    return {
        "amp_step": tuple(lab.amp_step_report(f, seed).score for f in (REF, BASE)),
        "scaler": tuple(
            lab.scaled_step_report(f, seed).score for f in (lab.reference_scaled_step, base_scaled)
        ),
        "accuracy_drop": (fp32 - bf16, 0.0),
        **{f"{which}_autocast": autocast_shares(which, seed) for which in ("text", "image")},
    }


def autocast_shares(which: str, seed: int) -> tuple[float, float]:
    """The graders' share of bf16 Linear/Conv outputs, for the reference and the baseline step."""
    shares = []
    for step in (REF, BASE):
        model, x, y = lab.timed_models(which, seed, copies=1)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        shares.append(lab.autocast_share(which, step, model, opt, x, y))
    return shares[0], shares[1]


REF, BASE = lab.reference_step, lab.baseline_step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        os.environ["PTCOURSE_SMOKE"] = "1"
    track = hardware.track_for(lab.LAB)
    kernels = torch.backends.cpu.get_cpu_capability()
    print(
        f"track {track.name} ({track.reason}); CPU {hardware.machine().cpu_model}; "
        f"flags {', '.join(hardware.cpu_flags())}; kernels {kernels}"
    )
    with measure.busy_cores(1, max_seconds=7200):
        rows: dict[str, list[tuple[float, float]]] = {}
        for run in range(args.runs):
            for name, pair in scores(seed=1000 + run).items():
                rows.setdefault(name, []).append(pair)
        for name, pairs in rows.items():
            refs, bases = [p[0] for p in pairs], [p[1] for p in pairs]
            print(
                f"{name}: reference {min(refs):.4g}..{max(refs):.4g}, baseline "
                f"{min(bases):.4g}..{max(bases):.4g} ({args.runs} seeds)"
            )
        for which in () if args.skip_speed else ("text", "image"):
            refs, copies = [], []
            for run in range(args.runs):
                ref, copy = one_run(which, seed=run)
                refs.append(ref)
                copies.append(copy)
                print(f"{which} run {run}: reference {ref:.3f}x, baseline copy {copy:.3f}x")
            print(
                f"{which}: reference {min(refs):.2f}-{max(refs):.2f}x, median "
                f"{statistics.median(refs):.2f}; baseline copy {min(copies):.2f}-"
                f"{max(copies):.2f}x ({args.runs} runs)"
            )


if __name__ == "__main__":
    main()
