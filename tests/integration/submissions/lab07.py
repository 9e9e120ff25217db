"""Lab 07 (export): a baseline-equivalent submission.

"baseline" pastes eager PyTorch into the export exercise: ``export_onnx`` hands back the module
itself, ``ort_session`` too (there is no session to set up) and ``ort_runner`` returns a
function that calls it. Its outputs are right (so it keeps the hidden correctness test) but it
must score 0 on the ONNX Runtime latency check and on the session's settings; it also fails the
visible quick test, which asks for a real ``onnx.ModelProto``.
No looper: the export exercise feeds three later cells, so a looping one would time out in each.
"""

EAGER = '''
def export_onnx(model, example):
    """The ONNX model (onnx.ModelProto) of ``model``, with a dynamic batch dimension."""
    return model


def ort_session(onnx_model):
    """An ONNX Runtime session of ``onnx_model``, set up for a fair one-thread CPU comparison."""
    return onnx_model


def ort_runner(onnx_model):
    """A function x -> logits running ``onnx_model`` in a session from ``ort_session``."""

    def run(x):
        with torch.inference_mode():
            return onnx_model(x)

    return run
'''

VARIANT = {
    "students": {
        "baseline": {"export_exercise": EAGER},
    },
    "speed_checks": ["test_speed_hidden", "test_session"],
    "loop_checks": [],
}
