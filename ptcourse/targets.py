"""The one table of graded targets: lab, check, track → target, with where it was measured.

Every target is set from measurements of the reference solution and of the baseline on the
machine named in ``measured_on``, with margin: the reference passes at least 99% of the time
under load, a baseline-equivalent submission fails. ``floor`` is where partial credit reaches
zero; credit is linear between ``floor`` and ``target``. Smoke mode shrinks problem sizes and
so speedups; ``smoke_target``/``smoke_floor`` hold the thresholds measured at smoke size.
"""

from __future__ import annotations

from dataclasses import dataclass

from ptcourse.smoke import is_smoke

HIGHER_IS_BETTER = ("speedup", "memory_ratio", "accuracy", "flops_ratio", "score")
LOWER_IS_BETTER = ("error", "accuracy_drop", "relative_error")


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
    smoke_target: float | None = None
    smoke_floor: float | None = None

    @property
    def higher_is_better(self) -> bool:
        return self.kind in HIGHER_IS_BETTER

    def thresholds(self) -> tuple[float, float]:
        """(target, floor) for the current mode."""
        if is_smoke() and self.smoke_target is not None:
            floor = self.smoke_floor if self.smoke_floor is not None else self.floor
            return self.smoke_target, floor
        return self.target, self.floor


CPU_VM = "2-core AMD EPYC VM (AVX2, no AVX-512/AMX), 1 thread, other core loaded"
SAPPHIRE = "2-core Intel Sapphire Rapids VM (AMX)"

# One block per lab, filled from that lab's measurements.
LAB00: tuple[Target, ...] = ()
LAB01: tuple[Target, ...] = ()

TARGETS: tuple[Target, ...] = LAB00 + LAB01


def target(lab: str, check: str, track: str) -> Target:
    """The target of ``check`` in ``lab`` on ``track``; a track without its own row uses cpu."""
    fallbacks = [track, "cpu"] if track != "cpu" else ["cpu"]
    for name in fallbacks:
        for row in TARGETS:
            if (row.lab, row.check, row.track) == (lab, check, name):
                return row
    raise KeyError(f"no target for lab {lab}, check {check!r}, track {track!r}")


def table_markdown() -> str:
    """The table as Markdown, for the README and the report card."""
    lines = [
        "| lab | check | track | target (smoke) | floor | reference measured | baseline | where |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for t in TARGETS:
        smoke = f" ({t.smoke_target:g})" if t.smoke_target is not None else ""
        lines.append(
            f"| {t.lab} | {t.check} | {t.track} | {t.kind} {t.target:g}{smoke} | {t.floor:g} "
            f"| {t.reference} | {t.baseline} | {t.measured_on}, {t.measured} |"
        )
    return "\n".join(lines)
