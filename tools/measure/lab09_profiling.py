"""Measure what lab 09's target rows grade, through the graders' own checks.

For each run and each mode (full, smoke; the sizes are the same, the timing budget is not):

- ``dominant_op`` and ``shape_and_stage``: ``check_diagnosis`` grades two answers against its
  own profile of the slow step on a secret seed. The reference answer is what the solution cell
  reads from a student's own profile (seed 0, the notebook's batch): the top operator, its
  costliest call's first input shape, the top stage. The baseline-equivalent answer names the
  runner-up operator (with its shape) and the runner-up stage.
- ``blame_list``: ``check_suspects`` grades two blame lists against its own profile. The
  reference answer is what the solution cell reads from a student's own profile (seed 0): every
  stage taking at least ``BLAME_SHARE`` of the step, with its share. The baseline-equivalent
  answer blames what reading the code suggests, the two Python loops ("features", "loss"), with
  their shares from the same profile.
- ``fixed_step``: ``check_fix_speed`` grades the reference fix (``reference_setup``,
  ``reference_step``) and the slow step pasted as the fix (``baseline_setup``, ``baseline_step``).

One torch thread, a busy-loop process keeping the other core loaded. Prints, per row, the spread
of the measured values (min–max, median) and the points each answer earned.

    .venv/bin/python tools/measure/lab09_profiling.py --runs 3 [--modes full,smoke]
        [--checks blame,diagnosis,speed]
"""

from __future__ import annotations

import argparse
from typing import Any

import torch
from reporting import graded, print_rows

from ptcourse.core import measure, smoke
from ptcourse.grading import checks
from ptcourse.labs import lab09_profiling as lab


def answers() -> dict[str, tuple[Any, Any, Any]]:
    """The diagnosis a student reads from their own profile, and the runner-up's."""
    found = lab.diagnose(seed=0)
    ops = sorted(found.self_ms, key=found.self_ms.get, reverse=True)
    stages = sorted(found.stage_ms, key=found.stage_ms.get, reverse=True)
    return {
        "reference": (ops[0], found.top_shapes[ops[0]], stages[0]),
        "baseline": (ops[1], found.top_shapes[ops[1]], stages[1]),
    }


def blame_lists() -> dict[str, dict[str, float]]:
    """The blame list a student reads from their own profile, and the code reader's guess."""
    shares = lab.diagnose(seed=0).stage_shares
    return {
        "reference": {k: round(v, 2) for k, v in shares.items() if v >= lab.BLAME_SHARE},
        "baseline": {k: round(shares[k], 2) for k in ("features", "loss")},
    }


def one_run(
    diagnoses: dict[str, tuple[Any, Any, Any]], blames: dict[str, dict[str, float]], which: str
) -> list[tuple[str, checks.Result]]:
    found = []
    if "blame" in which:
        for who, answer in blames.items():
            found += [(who, r) for r in graded(lab.check_suspects, answer)]
    if "diagnosis" in which:
        for who, answer in diagnoses.items():
            found += [(who, r) for r in graded(lab.check_diagnosis, *answer)]
    if "speed" not in which:
        return found
    fixes = {
        "reference": (lab.reference_setup, lab.reference_step),
        "baseline": (lab.baseline_setup, lab.baseline_step),
    }
    for who, fix in fixes.items():
        found += [(who, r) for r in graded(lab.check_fix_speed, *fix)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="full,smoke")
    parser.add_argument("--checks", default="blame,diagnosis,speed")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with measure.busy_cores(1, max_seconds=7200):
        for mode in args.modes.split(","):
            smoke.set_smoke(mode == "smoke")
            diagnoses, blames = answers(), blame_lists()
            found: dict[tuple[str, str], list[checks.Result]] = {}
            for _ in range(args.runs):
                for who, result in one_run(diagnoses, blames, args.checks):
                    found.setdefault((result.check, who), []).append(result)
            print(f"== lab 09, {mode} mode, {args.runs} runs ({lab.sizes()})")
            for who, answer in diagnoses.items():
                print(f"diagnosis answer, {who}: {answer}")
            for who, answer in blames.items():
                print(f"blame list, {who}: {answer}")
            print_rows(found)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
