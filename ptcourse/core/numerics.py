"""How far one result is from another: the course's two error metrics, computed in float64.

Both take a tensor or a sequence of tensors (gradients, parameters) on each side.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

Tensors = Tensor | Sequence[Tensor]


def _pairs(actual: Tensors, expected: Tensors) -> list[tuple[Tensor, Tensor]]:
    if isinstance(actual, Tensor) and isinstance(expected, Tensor):
        return [(actual, expected)]
    return list(zip(actual, expected, strict=True))


def max_abs_error(actual: Tensors, expected: Tensors) -> float:
    """The largest absolute difference over every element."""
    return max((a.double() - e.double()).abs().max().item() for a, e in _pairs(actual, expected))


def relative_error(actual: Tensors, expected: Tensors) -> float:
    """``||actual - expected|| / ||expected||`` (2-norm over all the tensors together)."""
    pairs = _pairs(actual, expected)
    num = sum(((a.double() - e.double()) ** 2).sum().item() for a, e in pairs)
    den = sum((e.double() ** 2).sum().item() for _, e in pairs)
    return (num / max(den, 1e-60)) ** 0.5
