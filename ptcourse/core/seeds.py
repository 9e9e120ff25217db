"""Seeded construction: the same weights from the same seed, without touching the global RNG."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def seeded(build: Callable[[], T], seed: int) -> T:
    """``build()`` with torch's global RNG seeded by ``seed``, restored afterwards."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)
