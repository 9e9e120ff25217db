"""Graded targets: what a row says, how a check finds its row, and the table of every lab's rows.

Each lab module keeps its own rows (``TARGETS``) next to the checks that use them
(``ptcourse.labs.all_targets()`` collects them). A row is set from measurements of the reference
solution and of a baseline-equivalent submission, with margin: the reference passes under load,
the baseline fails. ``floor`` is where partial credit reaches zero; credit is linear between
``floor`` and ``target``. ``script`` names the file in this repository that made the
measurement.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ptcourse.core import hardware

HIGHER_IS_BETTER = ("speedup", "memory_ratio", "accuracy", "flops_ratio", "score")
LOWER_IS_BETTER = ("error", "accuracy_drop", "relative_error")
# The machines the rows were measured on (every timing: 1 thread, the other core loaded).
CPU_VM = "2-core AMD EPYC VM (AVX2, no AVX-512/AMX), 1 thread, other core loaded"
ZEN4_VM = "2-core AMD EPYC Zen 4 VM (AVX-512, avx512_bf16), 1 thread, other core loaded"
AMX_VM = "2-core Intel Xeon VM (AVX-512, avx512_bf16, AMX), 1 thread, other core loaded"


@dataclass(frozen=True)
class Target:
    lab: str
    check: str
    track: str
    kind: str  # one of HIGHER_IS_BETTER or LOWER_IS_BETTER
    target: float
    floor: float
    reference: str  # what the reference solution measured (value and spread)
    baseline: str  # what a baseline-equivalent submission measured
    measured_on: str
    measured: str  # date
    script: str = ""  # repository path of the script that measured it ("" = not timed)

    @property
    def higher_is_better(self) -> bool:
        return self.kind in HIGHER_IS_BETTER

    def thresholds(self) -> tuple[float, float]:
        """(target, floor): full credit at the first, none at the second."""
        return self.target, self.floor


@dataclass(frozen=True)
class Goal:
    """One check's row on the track this machine runs: what a check is graded against."""

    row: Target
    track: hardware.Track


def pick(rows: Iterable[Target], check: str, track: str) -> Target:
    """The row of ``check`` on ``track``; a track without its own row uses the cpu row."""
    rows = tuple(rows)
    for name in dict.fromkeys((track, "cpu")):
        for row in rows:
            if (row.check, row.track) == (check, name):
                return row
    labs = sorted({row.lab for row in rows})
    raise KeyError(f"no target for check {check!r} on track {track!r} in lab(s) {labs}")


def goal(rows: Iterable[Target], check: str) -> Goal:
    """``check``'s row on the track its lab runs here (see :func:`hardware.track_for`)."""
    rows = tuple(rows)
    track = hardware.track_for(rows[0].lab)
    return Goal(pick(rows, check, track.name), track)


def table_markdown(rows: Iterable[Target]) -> str:
    """``rows`` as a Markdown table (``ptcourse targets`` prints every lab's)."""
    lines = [
        "| lab | check | track | target | floor | reference measured | baseline | where | script |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for t in rows:
        lines.append(
            f"| {t.lab} | {t.check} | {t.track} | {t.kind} {t.target:g} | {t.floor:g} "
            f"| {t.reference} | {t.baseline} | {t.measured_on}, {t.measured} | {t.script} |"
        )
    return "\n".join(lines)
