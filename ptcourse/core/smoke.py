"""Smoke mode: one switch that shrinks every lab so it runs in under a minute.

The switch is the environment variable ``PTCOURSE_SMOKE`` so that the autograder's kernel,
which nbgrader starts without parameters, inherits it; notebooks also set it from their
papermill parameter ``SMOKE`` via :func:`set_smoke`.
"""

from __future__ import annotations

import os
from typing import TypeVar

ENV_VAR = "PTCOURSE_SMOKE"
T = TypeVar("T")


def is_smoke() -> bool:
    """True when smoke mode is on (``PTCOURSE_SMOKE`` is 1/true/yes)."""
    return os.environ.get(ENV_VAR, "").strip().lower() in {"1", "true", "yes", "on"}


def set_smoke(on: bool, lab: str | None = None) -> bool:
    """Turn smoke mode on or off for this process and its children; returns the new state.

    A notebook calls ``set_smoke(SMOKE or is_smoke(), lab="NN")`` so that either the papermill
    parameter or the inherited environment variable switches it on; at full size it then says
    how long lab ``NN`` will take on this machine, from a short probe (:mod:`.estimate`).
    """
    os.environ[ENV_VAR] = "1" if on else "0"
    if lab is not None and not on:
        from ptcourse.core import estimate

        print(estimate.full_size_line(lab))
    return on


def pick(full: T, smoke: T) -> T:
    """Return ``smoke`` in smoke mode, else ``full``."""
    return smoke if is_smoke() else full
