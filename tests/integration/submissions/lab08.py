"""Lab 08 (TensorRT's ideas on a CPU): a baseline-equivalent submission.

"baseline" pastes the lab's baseline into the two exercises with a speed check:
``fuse_conv_bn`` returns an unfused copy of the model (the deployed model as it was) and
``to_bf16`` returns an fp32 copy. The fused-model cell then scores 0 (BatchNorm left), the
latency check 0 (speedup ≈ 1.0x, floor 1.1x) and the bf16 speed cell 0 (fp32 is not faster
than itself on CPUs with bf16 hardware; elsewhere no layer computes in bf16). ``fold_bn`` and
``optimized_session`` are the reference solutions (untouched).
No looper: every later section calls the exercises, so a looping one would time out in many cells.
"""

UNFUSED = '''
def fuse_conv_bn(model: nn.Module) -> nn.Module:
    """A new model with every Conv2d -> BatchNorm2d pair folded into one conv (eval mode)."""
    return copy.deepcopy(model).eval()
'''

FP32 = '''
def to_bf16(model: nn.Module) -> nn.Module:
    """A copy of `model` computing in bfloat16; float32 in, float32 out."""
    return copy.deepcopy(model).eval()
'''

VARIANT = {
    "students": {
        "baseline": {"fuse_conv_bn": UNFUSED, "to_bf16": FP32},
    },
    "speed_checks": ["test_fusion_speed_hidden", "test_bf16_speed_hidden"],
    "loop_checks": [],
}
