"""The labs: one module per lab, named like its notebook.

``solutions/06-attention/06-attention.ipynb`` ↔ ``ptcourse/labs/lab06_attention.py`` (the lineup
row's ``module``). Every lab module follows one contract, so that a reader, the tests and the
graders find the same things in the same places:

``LAB``
    the lab's row of the lineup (:data:`ptcourse.core.lineup.LABS`): number, title, tracks.
``TARGETS``
    its target rows (:class:`ptcourse.grading.targets.Target`): what the reference solution and a
    baseline-equivalent submission measured, on which machine, when, and the script under
    ``tools/measure/`` that measured it.
``Sizes`` and ``sizes()``
    one frozen dataclass of problem sizes, and the function that returns the sizes for the
    current mode (smoke or full; per track where the track changes them).
``baseline…`` and ``reference…``
    what the lab starts from and, where the lab has one, the instructor's answer: the code the
    graders time and compare a submission against (``baseline_step``, ``reference_block``…).
narrative helpers
    what the notebook prints and plots besides the exercises (tables, sweeps, demonstrations).
``check_<id>(answer, *, points) -> float``
    one per hidden test cell, ``<id>`` being the cell's nbgrader grade id without its ``test_``
    prefix and ``_hidden`` suffix (``test_speed_hidden`` → ``check_speed``). It draws its own
    fresh inputs, measures, compares with its ``TARGETS`` row through
    :mod:`ptcourse.grading.checks`, prints one line and returns the points earned (raising
    ``CheckFailed`` at zero). ``answer``
    is what the student wrote (a function, a class, a model…), passed positionally.

``JUDGED`` and ``VOUCHED`` (optional)
    the check ids the judge (:mod:`ptcourse.judge`) runs in its own process, with the answers
    as references into the sandboxed worker, and the quick-test cells (grade id → check id)
    whose points that check must vouch for. A check runs unchanged in a notebook and in the
    judge when it calls answers with data, times them through ``checks.timed`` and reads
    what ran through ``checks.beside``. Checks not listed run in the sandboxed worker.

A hidden test cell is then a few lines with no logic::

    ### BEGIN HIDDEN TESTS
    from ptcourse.labs import fresh

    fresh("06").check_speed(attention_sdpa, points=3)
    ### END HIDDEN TESTS

A module reads in this order (``tests/unit/labs/test_contract.py`` checks it): the imports; the
contract (``LAB``, ``JUDGED``, ``VOUCHED``, the measuring script, ``TARGETS``) before any def or
class; everything the notebook uses (sizes, baselines and references, narrative helpers) in the
order of its story; last, below one ``# The checks`` header, every ``check_<id>`` and the
helpers only the checks use.

Lab modules import from ``core``, ``assets`` and ``grading``, never from each other or from
``course`` (``tests/unit/test_layers.py`` enforces it).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from ptcourse.core.lineup import LABS, lab
from ptcourse.grading.targets import Target

# Reloaded, in this order, before a hidden check runs: the modules a check's verdict depends on.
GRADERS = (
    "ptcourse.core.hardware",
    "ptcourse.core.measure",
    "ptcourse.grading.targets",
    "ptcourse.grading.checks",
)


def module(key: str) -> ModuleType:
    """Lab ``key``'s module ("06", "06-attention" or "attention")."""
    return importlib.import_module(lab(key).module)


def fresh(key: str) -> ModuleType:
    """Reload the graders and lab ``key``'s module from disk and return the module.

    Hidden test cells call their check on what this returns, so names the notebook redefined or
    patched in these modules do not count.
    """
    for name in GRADERS:
        importlib.reload(importlib.import_module(name))
    return importlib.reload(module(key))


def written() -> list[ModuleType]:
    """The modules of every lab that has one, in lineup order (planned labs have none yet)."""
    found = []
    for each in LABS:
        try:
            found.append(importlib.import_module(each.module))
        except ModuleNotFoundError as missing:
            if missing.name != each.module:
                raise
    return found


def all_targets() -> tuple[Target, ...]:
    """Every written lab's target rows, in lineup order."""
    return tuple(row for each in written() for row in each.TARGETS)
