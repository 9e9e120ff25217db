"""Submissions the grading tests hand in, per lab: cell sources that replace the solution's.

"baseline" pastes the baseline into every exercise (it must score 0 on each speed check);
"looper" makes one exercise loop forever (it must lose only that exercise's points).
"""

VARIANTS: dict[str, dict] = {}
