"""ptcourse.labs.lab07_export: the lab-07 models behave as the lab says, and its helpers report honestly."""

from __future__ import annotations

import warnings

import pytest
import torch

from ptcourse.labs import lab07_export as export


def test_inspection_classifier_is_seeded_and_in_eval_mode() -> None:
    a, b = export.inspection_classifier(3), export.inspection_classifier(3)
    assert not a.training
    x = export.images(2, 32, generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        assert torch.equal(a(x), b(x))
        assert not torch.equal(a(x), export.inspection_classifier(4)(x))


def test_autogain_branches_on_brightness() -> None:
    dark, bright = export.dark_and_bright(generator=torch.Generator().manual_seed(0))
    model = export.AutoGain()
    assert torch.equal(model(dark), dark * export.GAIN)
    assert torch.equal(model(bright), bright)


def test_trace_bakes_in_the_branch_and_script_keeps_it() -> None:
    dark, bright = export.dark_and_bright(generator=torch.Generator().manual_seed(1))
    model = export.AutoGain()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, dark)
        scripted = torch.jit.script(model)
    assert not torch.equal(traced(bright), model(bright))
    assert torch.equal(scripted(bright), model(bright))
    assert torch.equal(scripted(dark), model(dark))


def test_torch_export_refuses_the_data_dependent_branch() -> None:
    dark, _ = export.dark_and_bright()
    result, error = export.try_quietly(lambda: torch.export.export(export.AutoGain(), (dark,)))
    assert result is None and error is not None
    assert "data-dependent" in export.error_summary(error)


def test_median_norm_subtracts_the_lower_median() -> None:
    x = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).reshape(2, 3, 2, 2)
    out = export.MedianNorm()(x)
    assert out.shape == x.shape
    assert out[0].flatten()[5].item() == 0.0  # 12 values: the lower median is the 6th


def test_error_summary_strips_colour_and_keeps_the_summary() -> None:
    text = "Failed \x1b[96mstep\x1b[0m\n## Exception summary\n\nNo ONNX function found"
    text += "\n⬆️\n(Refer to the full stack trace"
    summary = export.error_summary(RuntimeError(text))
    assert summary == "RuntimeError: No ONNX function found"


def test_max_abs_difference_reports_shape_errors() -> None:
    model = export.inspection_classifier(0, channels=4)
    xs = [export.images(b, 16) for b in (1, 3)]
    diffs = export.max_abs_difference(lambda x: model(x), model, xs)
    assert diffs == {1: 0.0, 3: 0.0}
    with pytest.raises(AssertionError, match="shape"):
        export.max_abs_difference(lambda x: model(x)[:1], model, xs[1:])
    with pytest.raises(AssertionError, match="runner failed"):
        export.max_abs_difference(lambda x: 1 / 0, model, xs[:1])


def test_dynamic_dims_reads_names_and_sizes() -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
    )
    assert export.dynamic_dims(onnx.helper.make_model(graph)) == [["batch", 3]]
