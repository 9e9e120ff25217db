"""Lab 03 (mixed precision): a baseline-equivalent submission.

"baseline" pastes the plain fp32 step into both exercises (the fp16 one ignores its scaler). It
must score 0 on every check that tells mixed precision from fp32 — the speed checks on AMX CPUs
and GPUs, and on every track the checks that the layers ran in bf16/fp16 under autocast and that
the GradScaler was used. It keeps the accuracy check (fp32 loses no accuracy against fp32).
No looper: a looping step would time out in eight cells (about eight minutes of grading).
"""

FP32_AMP_STEP = '''
def amp_step(model, optimizer, x, y):
    """One training step with the forward pass under bf16 autocast; returns the loss."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
'''

FP32_SCALED_STEP = '''
def scaled_step(model, optimizer, scaler, x, y):
    """One fp16 mixed-precision training step with loss scaling; returns the loss."""
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()
'''

VARIANT = {
    "students": {
        "baseline": {"amp_step": FP32_AMP_STEP, "scaled_step": FP32_SCALED_STEP},
    },
    # The checks the baseline must fail (speed, or autocast/GradScaler in effect).
    "speed_checks": [
        "test_amp_step_quick",
        "test_amp_step",
        "test_text_speed",
        "test_image_speed",
        "test_scaled_step_quick",
        "test_scaled_step",
    ],
    "loop_checks": [],
}
