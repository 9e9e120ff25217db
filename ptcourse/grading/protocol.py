"""The one interface between a check and the answer it grades, wherever the answer lives.

A check never calls an answer's process directly. It goes through four functions of
:mod:`ptcourse.grading.checks` — :func:`~ptcourse.grading.checks.timed`,
:func:`~ptcourse.grading.checks.timed_alike`, :func:`~ptcourse.grading.checks.run_alike`,
:func:`~ptcourse.grading.checks.beside` — and each looks for a method **of the same name** on
the answer's type:

- in a notebook the answer is a plain Python object with none of them, and the functions run
  everything here (inputs drawn once; one output verified before timing);
- in the judge the answer is a :class:`ptcourse.judge.remote.Remote`, a reference to an object
  in the sandboxed worker, whose type implements :class:`Place`: the judge's clock, the
  kernel's accounting, fresh inputs per call and verified outputs.

What a speed or memory check then measures is a :class:`Measured` (the name
:mod:`ptcourse.core.measure` knows it by is ``TimedElsewhere``): ``measure.compare``,
``compare_many`` and ``peak_memory`` time its blocks with :meth:`Measured.time_block` and read
its memory with :meth:`Measured.peak_bytes` instead of calling it in this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ptcourse.core.measure import TimedElsewhere as Measured

__all__ = ["Measured", "Place"]


class Place(Protocol):
    """Where an answer lives, other than here: what the judge's references implement."""

    def timed(
        self,
        make_args: Callable[[], tuple],
        verify: Callable[[tuple, Any], None],
        *,
        inference: bool = False,
        via: Callable[..., Any] | None = None,
    ) -> Measured:
        """This answer's calls on fresh inputs from ``make_args``, each block's outputs
        checked with ``verify``; ``via(answer, *args)`` where the measured work drives it."""
        ...

    def timed_alike(
        self, fn: Callable[..., Any], make_args: Callable[[], tuple], *, inference: bool = False
    ) -> Measured:
        """``fn(*make_args())`` — the course's own code (a baseline, a reference) — measured
        as this answer is, where no student code runs (the judge's trusted twin)."""
        ...

    def run_alike(self, fn: Callable[..., Any], *args: Any) -> Any:
        """``fn(*args)`` run as this answer runs, where no student code runs; data back."""
        ...

    def beside(self, fn: Callable[..., Any], *args: Any, keep: bool = False) -> Any:
        """``fn(answer, *args)`` in the answer's process (its result is that process's word:
        a check uses it for what only that process can see, never for time or memory)."""
        ...
