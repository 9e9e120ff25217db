"""Lab 11 (batching): a baseline-equivalent submission.

"baseline" serves one request at a time: ``batched_predict`` loops over the requests (right
outputs, so it keeps the correctness check, but ~1.0x: 0 on the speed check), and the policy
runs every request alone without waiting (knobs ``(1, 0.0)``): it fails the heavy load (its
queue grows without bound) and with it the visible policy test that the heavy check vouches
for. It keeps the light-load points: serving one at a time is right at a light load.
No looper: a looping policy would stall the real load test and every cell after it.
"""

ONE_AT_A_TIME = '''
def batched_predict(model, reqs):
    """One forward pass for all requests; one output per request, in order."""
    return [model(r.unsqueeze(0)).squeeze(0) for r in reqs]
'''

BATCH_ONE_POLICY = '''
def dispatch(ages_s, max_batch, max_wait_s):
    """How many of the oldest waiting requests to run now (0: keep waiting)."""
    return 1


def choose_knobs(curve):
    """(max_batch, max_wait_s) for a model with this batch-size curve."""
    return 1, 0.0


KNOBS = choose_knobs(CURVE)
print(f"max_batch {KNOBS[0]}, max_wait {KNOBS[1] * 1e3:.3f} ms")
'''

VARIANT = {
    "students": {
        "baseline": {"batched_predict": ONE_AT_A_TIME, "policy": BATCH_ONE_POLICY},
    },
    "speed_checks": [
        "test_batched_speed_hidden",
        "test_policy_visible",
        "test_heavy_load_hidden",
    ],
    "loop_checks": [],
}
