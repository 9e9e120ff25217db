"""Lab 04 (gradient accumulation): a baseline-equivalent submission.

"baseline" pastes the lab's baseline — one forward and backward over the whole batch, ignoring
``accum_steps`` and the scaler — into the exercise. Its gradients are right (so it keeps the
gradient tests), but it must score 0 on the peak-memory check and on both AMP checks (no
autocast, no loss scaling).
No looper: every later section calls ``accumulated_step``, so a looping one would time out in
about ten cells (ten minutes of grading).
"""

ONE_BIG_BATCH = '''
def accumulated_step(model, loss_fn, x, y, accum_steps, scaler=None):
    """Add the full batch's mean-loss gradient to .grad, one micro-batch at a time."""
    loss = loss_fn(model(x), y)
    loss.backward()
    return loss.item()
'''

VARIANT = {
    "students": {
        "baseline": {"accumulated_step": ONE_BIG_BATCH},
    },
    "speed_checks": ["test_memory_hidden", "test_amp_visible", "test_amp_hidden"],
    "loop_checks": [],
}
