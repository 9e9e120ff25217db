"""ptcourse.labs.lab07_export: the lab-07 models behave as the lab says, its helpers report
honestly, and its four graders score a right, a wrong and a baseline-equivalent answer."""

from __future__ import annotations

import warnings

import pytest
import torch

from ptcourse.assets import onnx_runtime
from ptcourse.core import measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.grading import checks
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


# ---------------------------------------------------------------------------------------------
# The graders: a right, a wrong and a baseline-equivalent answer each (smoke, fixed secret seed)


def _export_onnx(model, example):
    """The lab's export exercise (the solution)."""
    batch = torch.export.Dim("batch", min=1, max=1024)
    return torch.onnx.export(
        model, (example,), dynamo=True, dynamic_shapes=({0: batch},), verbose=False
    ).model_proto


def _ort_runner(onnx_model):
    session = onnx_runtime.session(onnx_model, threads=1)
    return lambda x: onnx_runtime.run(session, x)


def _eager_runner(onnx_model):
    """The baseline-equivalent runner: the "ONNX model" is the eager module itself."""
    return export.baseline_runner(onnx_model)


class _SortMedianNorm(torch.nn.Module):
    def forward(self, x):
        flat = x.flatten(1)
        middle = (flat.shape[1] - 1) // 2
        return (flat - flat.sort(dim=1).values[:, middle : middle + 1]).view_as(x)


class _MeanNorm(torch.nn.Module):
    def forward(self, x):
        flat = x.flatten(1)
        return (flat - flat.mean(dim=1, keepdim=True)).view_as(x)


class _CondAutoGain(torch.nn.Module):
    def forward(self, x):
        return torch.cond(
            x.mean() < export.DARK, lambda x: x * export.GAIN, lambda x: x.clone(), (x,)
        )


def _onnx(module, dynamic=True):
    example = export.images(2, 64, generator=torch.Generator().manual_seed(0))
    shapes = ({0: torch.export.Dim("batch", min=1, max=1024)},) if dynamic else None
    with captured_stderr():
        return torch.onnx.export(
            module, (example,), dynamo=True, dynamic_shapes=shapes, verbose=False
        ).model_proto


@pytest.fixture
def smoke(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv(checks.SEED_ENV, "3")


@pytest.fixture(scope="module")
def classifier_onnx():
    if not onnx_runtime.available():
        pytest.skip("onnxruntime not installed")
    example = export.images(2, 64, generator=torch.Generator().manual_seed(0))
    with captured_stderr():
        return _export_onnx(export.inspection_classifier(seed=0), example)


@pytest.fixture(scope="module")
def other_onnx(classifier_onnx):
    """A wrong answer: the classifier with other weights than the notebook's (seed 1)."""
    return _onnx(export.inspection_classifier(seed=1))


def test_sizes_shrink_only_the_notebook_timings(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = export.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    small = export.sizes()
    assert small.time_budget_s < full.time_budget_s
    assert small.hidden_batches == full.hidden_batches == ((5, 11), (3, 6))
    assert small.image == full.image == 64


def test_check_export(smoke, classifier_onnx, other_onnx, capsys):
    assert export.check_export(_ort_runner, classifier_onnx, points=3) == 3.0
    assert "agrees with eager" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="ONNX Runtime at batch"):
        export.check_export(_ort_runner, other_onnx, points=3)
    # baseline-equivalent: eager PyTorch pasted in is right, only not exported
    assert export.check_export(_eager_runner, export.inspection_classifier(seed=0), points=3) == 3


def _session_with(
    threads=1,
    spin="0",
    level="ORT_ENABLE_ALL",
    providers=("CPUExecutionProvider",),
    parallel_threads=None,
):
    """An ort_session answer: the solution's settings, one of them changed by the caller."""
    import onnxruntime as ort

    def ort_session(onnx_model):
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
        if spin is not None:
            opts.add_session_config_entry("session.intra_op.allow_spinning", spin)
            opts.add_session_config_entry("session.inter_op.allow_spinning", spin)
        if parallel_threads is not None:
            opts.execution_mode = ort.ExecutionMode.ORT_PARALLEL
            opts.inter_op_num_threads = parallel_threads
        opts.log_severity_level = 3
        return ort.InferenceSession(
            onnx_model.SerializeToString(), sess_options=opts, providers=list(providers)
        )

    return ort_session


def test_settings_reads_back_what_the_session_runs_with(classifier_onnx):
    fair = onnx_runtime.settings(onnx_runtime.session(classifier_onnx, threads=1))
    assert fair["intra_op_threads"] == 1 and not fair["intra_op_spinning"]
    assert fair["optimization"] == "ORT_ENABLE_ALL"
    assert fair["providers"] == ["CPUExecutionProvider"]
    with captured_stderr():
        default = onnx_runtime.settings(_session_with(threads=0, spin=None)(classifier_onnx))
    assert default["intra_op_threads"] == 0 and default["intra_op_spinning"]


def test_check_session_passes_a_fair_session_and_names_each_unfair_setting(
    smoke, classifier_onnx, capsys
):
    assert export.check_session(_session_with(), classifier_onnx, points=2) == 2.0
    assert "1 intra-op thread" in capsys.readouterr().out
    unfair = {
        "intra_op_threads is 0": _session_with(threads=0),  # one thread per core
        "intra_op_threads is 2": _session_with(threads=2),
        "intra_op_spinning is True": _session_with(spin=None),  # ORT's default
        "optimization is 'ORT_ENABLE_BASIC'": _session_with(level="ORT_ENABLE_BASIC"),
        "parallel execution with inter_op_threads 2": _session_with(parallel_threads=2),
        "providers": _session_with(providers=("AzureExecutionProvider", "CPUExecutionProvider")),
    }
    for message, answer in unfair.items():
        with pytest.raises(checks.CheckFailed, match=message):
            export.check_session(answer, classifier_onnx, points=2)
    # baseline-equivalent: no session at all (eager PyTorch pasted in)
    with pytest.raises(checks.CheckFailed, match="not an ort.InferenceSession"):
        export.check_session(lambda model: model, export.inspection_classifier(0), points=2)


def test_check_speed(smoke, classifier_onnx, other_onnx, capsys):
    with measure.pinned_threads(1):
        assert export.check_speed(_ort_runner, classifier_onnx, points=3) == 3.0
        assert "ort_latency" in capsys.readouterr().out
        with pytest.raises(checks.CheckFailed, match="ONNX Runtime at batch 1"):
            export.check_speed(_ort_runner, other_onnx, points=3)
        with pytest.raises(checks.CheckFailed, match="zero credit"):
            export.check_speed(_eager_runner, export.inspection_classifier(seed=0), points=3)


def test_check_median(smoke, capsys):
    if not onnx_runtime.available():
        pytest.skip("onnxruntime not installed")
    assert export.check_median(_onnx(_SortMedianNorm()), points=3) == 3.0
    assert "defect" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="batch 3"):
        export.check_median(_onnx(_MeanNorm()), points=3)
    # baseline-equivalent: the export the lab starts from, without a dynamic batch, fails
    with pytest.raises(Exception, match="(?i)dimension|shape|invalid"):
        export.check_median(_onnx(_SortMedianNorm(), dynamic=False), points=3)


def _trace(model, example):
    with captured_stderr():
        return torch.jit.trace(model, example)


def test_check_branch(smoke, capsys):
    script = lambda model, example: torch.jit.script(model)  # noqa: E731
    assert export.check_branch(script, _CondAutoGain, points=3) == 3.0
    assert "fresh inputs" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="TorchScript, dark"):
        export.check_branch(_trace, _CondAutoGain, points=3)  # traced on a bright example
    # baseline-equivalent: AutoGain as it is cannot be exported
    with pytest.raises(Exception, match="(?i)data-dependent"):
        export.check_branch(script, export.AutoGain, points=3)


def test_check_speed_where_speed_is_not_gradable_grades_onnx_runtime_in_effect(
    smoke, classifier_onnx, monkeypatch, capsys
):
    import dataclasses

    unreachable = tuple(dataclasses.replace(row, floor=50.0, target=60.0) for row in export.TARGETS)
    monkeypatch.setattr(export, "TARGETS", unreachable)  # no reference clears a 50x floor
    with measure.pinned_threads(1):
        assert export.check_speed(_ort_runner, classifier_onnx, points=3) == 3.0
        assert "not gradable" in capsys.readouterr().out
        with pytest.raises(checks.CheckFailed, match="did not run in ONNX Runtime"):
            export.check_speed(_eager_runner, export.inspection_classifier(seed=0), points=3)
