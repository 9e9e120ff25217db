"""Lab 13 (capstone): a baseline-equivalent submission — the line the lab starts from.

"baseline" hands in ``lab.BaselineLine`` as its ``inspect_lot`` (the stage exercises left as
released): its reports are the baseline's, so it keeps the findings, the breakdown and the
visible test, and scores 0 on the lot speed check.
"""

BASELINE_LINE = '''
def inspect_lot(frames, timer):
    """A lot's JPEG frames → one report per frame; each stage timed with timer.stage(name)."""
    return baseline(frames, timer)
'''

VARIANT = {
    "students": {"baseline": {"inspect_lot": BASELINE_LINE}},
    "speed_checks": ["test_lot_speed_hidden"],
    "loop_checks": [],
}
