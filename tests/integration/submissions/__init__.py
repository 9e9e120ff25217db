"""Submissions the grading tests hand in, one module per lab (``labNN.py``).

Each module defines ``VARIANT = {"students": {name: {grade_id: cell source}}, "speed_checks":
[grade_id, ...], "loop_checks": [grade_id, ...]}``: cell sources that replace the solution's.
"baseline" pastes the baseline into every exercise (it must score 0 on each speed check);
"looper" (optional) makes one exercise loop forever (it must lose only ``loop_checks``' points).
"""

import importlib
import pkgutil

from ptcourse.core.lineup import lab

VARIANTS: dict[str, dict] = {}
for _info in pkgutil.iter_modules(__path__):
    if _info.name.startswith("lab"):
        _module = importlib.import_module(f"{__name__}.{_info.name}")
        VARIANTS[lab(_info.name[3:]).name] = _module.VARIANT
