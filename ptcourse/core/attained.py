"""What a notebook's workloads attained (FLOP/s at an arithmetic intensity), for the report card.

A lab that measures points on this machine's roofline records them with :func:`record`; when
``ptcourse run`` executes the notebook it sets ``PTCOURSE_ATTAINED`` to a file, and the report
card places each point against the ceilings it measured itself. Outside ``ptcourse run`` the
call does nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

ENV = "PTCOURSE_ATTAINED"


def record(points: dict[str, tuple[float, float]]) -> None:
    """Append ``{workload: (FLOP per byte, FLOP/s attained)}`` to the run's file, if any."""
    path = os.environ.get(ENV)
    if not path:
        return
    with open(path, "a") as f:
        for workload, (intensity, flops_per_s) in points.items():
            row = {"workload": workload, "intensity": intensity, "flops_per_s": flops_per_s}
            f.write(json.dumps(row) + "\n")


def read(path: Path) -> list[dict]:
    """The rows :func:`record` wrote into ``path`` (none if it does not exist)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
