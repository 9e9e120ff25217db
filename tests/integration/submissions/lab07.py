"""Lab 07 (export): a baseline-equivalent submission.

"baseline" pastes eager PyTorch into the export exercise: ``export_onnx`` hands back the module
itself and ``ort_runner`` returns a function that calls it. Its outputs are right (so it keeps
the hidden correctness test) but it must score 0 on the ONNX Runtime latency check; it also
fails the visible quick test, which asks for a real ``onnx.ModelProto``.
No looper: the export exercise feeds three later cells, so a looping one would time out in each.
"""

EAGER = '''
def export_onnx(model, example):
    """The ONNX model (onnx.ModelProto) of ``model``, with a dynamic batch dimension."""
    return model


def ort_runner(onnx_model):
    """A function x -> logits running ``onnx_model`` in ONNX Runtime (1 thread, no spinning)."""

    def run(x):
        with torch.inference_mode():
            return onnx_model(x)

    return run
'''

VARIANT = {
    "students": {
        "baseline": {"export_exercise": EAGER},
    },
    "speed_checks": ["test_speed_hidden"],
    "loop_checks": [],
}
