"""Lab 10 (quantization): a baseline-equivalent submission.

"baseline" returns the float model unchanged from both exercises (no quantization at all): its
predictions are the fp32 ones, so it keeps the closeness checks, but it must score 0 on the size
checks (1.0x) and on the speed check (~1.0x; the speed cell also holds the accuracy check, and a
cell whose speed check fails scores 0 as a whole).
No looper: a looping exercise would time out the table and every test cell after it.
"""

FLOAT_TORCHAO = '''
def torchao_int8(model):
    """A copy of `model` with torchao int8 dynamic-activation, int8-weight Linear layers."""
    return copy.deepcopy(model)
'''

FLOAT_FAST = '''
def fast_int8(model):
    """An int8-quantized copy of `model`: smaller, faster here, as accurate."""
    return copy.deepcopy(model)
'''

VARIANT = {
    "students": {
        "baseline": {"torchao_int8": FLOAT_TORCHAO, "fast_int8": FLOAT_FAST},
    },
    "speed_checks": [
        "test_torchao_visible",
        "test_fast_visible",
        "test_torchao_hidden",
        "test_fast_size_hidden",
        "test_fast_speed_hidden",
    ],
    "loop_checks": [],
}
