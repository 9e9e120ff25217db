"""Lab 05 (efficient blocks): a baseline-equivalent submission.

"baseline" pastes the standard block (3x3 conv, BatchNorm, ReLU) into the exercise as the
"efficient" block, and counts the standard block's FLOPs in the formula exercise. It trains as
well as the standard block (it is one), so it keeps the accuracy check; it must score 0 on the
FLOPs-ratio check (ratio 1.0). Nothing in this lab grades time: FLOPs do not predict time on a
CPU here, which is the lab's point, so the FLOPs ratio is the only "speed" check.
No looper: the training, timing and roofline cells all call the block, so a looping block would
time out half a dozen cells.
"""

STANDARD_AS_EFFICIENT = '''
class EfficientBlock(nn.Module):
    """Baseline-equivalent: the standard 3x3 conv block."""

    def __init__(self, c_in, c_out, stride=1):
        super().__init__()
        self.body = lab.baseline_block(c_in, c_out, stride)

    def forward(self, x):
        return self.body(x)
'''

STANDARD_FLOPS = '''
def efficient_block_flops(c_in, c_out, height, width, stride=1, batch=1):
    """Baseline-equivalent: the standard block's FLOPs."""
    pixels = lab.out_size(height, stride) * lab.out_size(width, stride)
    return 2 * batch * pixels * c_in * c_out * 9
'''

VARIANT = {
    "students": {
        "baseline": {
            "efficient_block": STANDARD_AS_EFFICIENT,
            "efficient_block_flops": STANDARD_FLOPS,
        },
    },
    "speed_checks": ["test_flops_ratio_hidden"],
    "loop_checks": [],
}
