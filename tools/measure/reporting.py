"""What the measurement scripts share: grade an answer through a lab's own check, and print
each target row's spread over the runs.

The scripts run as ``python tools/measure/labNN_*.py``, so this folder is on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import io
import statistics
from collections.abc import Callable
from typing import Any

from ptcourse.grading import checks


def graded(check: Callable[..., float], *answer: Any, points: float = 3) -> list[checks.Result]:
    """The results ``check`` recorded for ``answer`` (its printed lines swallowed; none where it
    failed before grading a row)."""
    before = len(checks.RESULTS)
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(checks.CheckFailed):
        check(*answer, points=points)
    return checks.RESULTS[before:]


def spread(values: list[float]) -> str:
    return f"{min(values):.3g}–{max(values):.3g}, median {statistics.median(values):.3g}"


def print_rows(found: dict[tuple[str, str], list[checks.Result]]) -> None:
    """Per (row, answer): the values' spread, the points of each run, the last run's line."""
    row_width = max(len(row) for row, _ in found) + 1
    who_width = max(len(who) for _, who in found) + 1
    for (row, who), results in sorted(found.items()):
        points = ", ".join(f"{r.points:g}" for r in results)
        print(f"{row:<{row_width}}{who:<{who_width}}{spread([r.value for r in results])}; "
              f"points {points}")  # fmt: skip
        last = results[-1].message.splitlines()[-1].strip()
        print(f"{'':<{row_width + who_width}}last run: {last}")
