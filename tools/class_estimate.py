"""How long grading a class takes, from a pilot run's measured per-submission times.

    python tools/class_estimate.py build/grades/grades.json [--students 300] [--cores 64]

Reads the seconds `ptcourse grade` recorded for each graded submission (each lane on its own
cores: grade the pilot with `--lanes` equal to the pilot machine's cores, or on a cluster), takes
the median per lab, and scales: a class of S students needs S x (sum of the labs' medians) lane-
seconds, spread over the machine's lanes (one per core for the course's one-thread timing).
Labs the pilot did not grade are left out of the sum and listed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from ptcourse.core.lineup import LABS


def per_lab_seconds(paths: list[Path]) -> dict[str, float]:
    """The median grading time of each lab's graded submissions in ``paths`` (grades.json)."""
    times: dict[str, list[float]] = {}
    for path in paths:
        for score in json.loads(path.read_text()):
            if score["status"] == "graded" and score.get("seconds"):
                times.setdefault(score["lab"], []).append(score["seconds"])
    return {lab: statistics.median(t) for lab, t in sorted(times.items())}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("grades", nargs="+", type=Path, help="grades.json files of a pilot")
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--cores", type=int, default=64, help="cores of one grading machine")
    parser.add_argument("--cores-per-lane", type=int, default=1)
    args = parser.parse_args()
    seconds = per_lab_seconds(args.grades)
    for lab, s in seconds.items():
        print(f"{lab:<24}{s:7.1f} s per submission (median)")
    missing = [each.name for each in LABS if each.name not in seconds]
    per_student = sum(seconds.values())
    lanes = args.cores // args.cores_per_lane
    hours = args.students * per_student / lanes / 3600
    print(f"one student, {len(seconds)} labs: {per_student / 60:.1f} lane-minutes")
    print(f"{args.students} students on one {args.cores}-core machine ({lanes} lanes): "
          f"{hours:.1f} hours")  # fmt: skip
    if missing:
        print(f"not in the pilot (left out): {', '.join(missing)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
