import copy

import pytest
import torch
from torch import nn

from ptcourse.assets import onnx_runtime
from ptcourse.core import measure
from ptcourse.labs import lab10_quantization as quantize
from ptcourse.core.quiet import captured_stderr

TINY = quantize.Config(vocab=256, length=8, d_model=64, heads=2, layers=1, batch=32)


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


def _legacy_int8(model):
    with captured_stderr():
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8
        )


def test_random_tokens_are_padded_at_the_end_and_in_range():
    x = quantize.random_tokens(50, TINY, torch.Generator().manual_seed(0))
    assert x.shape == (50, TINY.length) and x.dtype == torch.long
    assert x.max() < TINY.vocab and (x[:, :6] >= 2).all()  # at least 6 real tokens
    pad = x == 0
    assert torch.equal(pad, pad.cummax(dim=1).values), "padding only after the last token"
    assert torch.equal(x, quantize.random_tokens(50, TINY, torch.Generator().manual_seed(0)))


def test_size_ratio_sees_int8_layers_and_not_a_float_copy():
    model = quantize.build_classifier(TINY).eval()
    assert quantize.size_ratio(model, copy.deepcopy(model)) == 1.0
    assert quantize.size_ratio(model, _legacy_int8(model)) > 2.8  # tiny: overhead
    assert quantize.size_ratio(model, quantize.torchao_weight_only(model)) > 2.8
    with pytest.raises(ValueError, match="no layer"):
        quantize.layer_bytes(nn.Sequential(), quantize.linear_names(model))


def test_size_ratio_works_on_inference_mode_models():
    model = quantize.build_classifier(TINY).eval()
    with torch.inference_mode():
        quantized = quantize.torchao_weight_only(model)
        assert quantize.size_ratio(model, quantized) > 2.8
    assert quantize.size_ratio(model, quantized) > 2.8


def test_quantized_outputs_stay_close():
    model = quantize.build_classifier(TINY).eval()
    x = quantize.random_tokens(16, TINY, torch.Generator().manual_seed(1))
    with torch.inference_mode():
        want = model(x)
        for quantized in (_legacy_int8(model), quantize.torchao_weight_only(model)):
            assert (quantized(x) - want).abs().max() < 0.1 * want.abs().max()


def test_flop_split_linear_dominates_short_sequences_only():
    short = quantize.flop_split(quantize.build_classifier(TINY), quantize.random_tokens(4, TINY))
    assert short["linear"] > 10 * short["attention"] > 0
    long_cfg = quantize.Config(vocab=64, length=512, d_model=32, heads=2, layers=1)
    long = quantize.flop_split(
        quantize.build_classifier(long_cfg), quantize.random_tokens(1, long_cfg)
    )
    assert long["attention"] > 0.5 * long["linear"]


def test_trained_classifier_is_cached_and_learns(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path))
    quantize._headlines.cache_clear()
    try:
        first = quantize.trained_classifier(smoke=True, config=TINY)
        path = quantize.cache_path(True, TINY)
        assert path.exists() and str(path).startswith(str(tmp_path))
        again = quantize.trained_classifier(smoke=True, config=TINY)
        assert all(
            torch.equal(a, b)
            for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True)
        )
        split = quantize.headlines(True, TINY)
        assert quantize.accuracy_points(first, split.x_test, split.y_test) > 50  # chance is 25
        assert not first.training
    finally:
        quantize._headlines.cache_clear()


@pytest.mark.skipif(not onnx_runtime.available(), reason="onnxruntime is not installed")
def test_onnx_export_and_int8_round_trip(tmp_path):
    model = quantize.build_classifier(TINY).eval()
    fp32 = quantize.export_onnx(model, tmp_path / "m.onnx", TINY)
    int8 = quantize.onnx_int8(fp32, tmp_path / "m.int8.onnx")
    x = quantize.random_tokens(5, TINY, torch.Generator().manual_seed(2))
    with torch.inference_mode():
        want = model(x)
    a, b = quantize.ort_classifier(fp32), quantize.ort_classifier(int8)
    assert (a(x) - want).abs().max() < 1e-4
    assert (b(x) - want).abs().max() < 0.3 * want.abs().max()  # per-tensor, untrained
    assert b.file_bytes < a.file_bytes / 2


def test_int8_cpu_flags_are_known_names():
    assert set(quantize.int8_cpu_flags()) <= set(quantize.INT8_FLAGS)
