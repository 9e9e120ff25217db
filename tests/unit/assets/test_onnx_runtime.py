"""ptcourse.assets.onnx_runtime: sessions with spinning off, torch in and out."""

from __future__ import annotations

import pytest
import torch

from ptcourse.assets import onnx_runtime as ortx

pytestmark = pytest.mark.skipif(not ortx.available(), reason="onnxruntime is not installed")


def _linear_model() -> bytes:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(torch.arange(6.0).reshape(3, 2).numpy(), name="w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "linear",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 2])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model)
    return model.SerializeToString()


def test_options_turn_spinning_off_and_pin_threads() -> None:
    opts = ortx.options(threads=1, optimization="disabled")
    assert opts.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert opts.get_session_config_entry("session.inter_op.allow_spinning") == "0"
    assert opts.intra_op_num_threads == 1


def test_run_matches_torch_at_any_batch(tmp_path) -> None:
    model = _linear_model()
    path = tmp_path / "linear.onnx"
    path.write_bytes(model)
    w = torch.arange(6.0).reshape(3, 2)
    for source in (model, path, str(path)):
        sess = ortx.session(source, optimization="all")
        for batch in (1, 7):
            x = torch.randn(batch, 3)
            torch.testing.assert_close(ortx.run(sess, x), x @ w)
    assert ortx.input_names(sess) == ["x"]


def test_bad_arguments_are_rejected() -> None:
    with pytest.raises(ValueError):
        ortx.options(optimization="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        ortx.session(_linear_model(), device="tpu")
    with pytest.raises(TypeError):
        ortx.session(3.0)
    with pytest.raises(ValueError):
        ortx.run(ortx.session(_linear_model()), torch.ones(1, 3), torch.ones(1, 3))


def test_cuda_without_provider_says_so() -> None:
    if "CUDAExecutionProvider" in ortx.providers():
        pytest.skip("the CUDA provider is installed here")
    with pytest.raises(RuntimeError, match="CUDAExecutionProvider"):
        ortx.session(_linear_model(), device="cuda")
