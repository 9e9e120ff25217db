import copy

import pytest
import torch
from torch import nn

from ptcourse.assets import onnx_runtime, text
from ptcourse.core import measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.grading import checks
from ptcourse.labs import lab10_quantization as quantize

TINY = quantize.Sizes(vocab=256, length=8, d_model=64, heads=2, layers=1, train_batch=32)
SEED = "1234"


def tokens(batch, size=TINY, seed=0):
    return text.random_tokens(
        batch, size.length, size.vocab, min_length=size.min_tokens, lowest_id=size.first_id,
        generator=torch.Generator().manual_seed(seed),
    )  # fmt: skip


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


def _legacy_int8(model):
    with captured_stderr():
        return torch.ao.quantization.quantize_dynamic(
            copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8
        )


def test_random_headlines_are_the_ones_the_lab_drew_before_the_shared_home():
    """text.random_tokens with the lab's sizes draws what the lab's own function drew (graded
    inputs unchanged): ids in [2, vocab), at least 6 tokens, then padding."""
    size = quantize.sizes()
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(2, size.vocab, (64, size.length), generator=g)
    lengths = torch.randint(6, size.length + 1, (64, 1), generator=g)
    before = ids.masked_fill(torch.arange(size.length) >= lengths, 0)
    assert torch.equal(tokens(64, size, seed=5), before)


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
    x = tokens(16, seed=1)
    with torch.inference_mode():
        want = model(x)
        for quantized in (_legacy_int8(model), quantize.torchao_weight_only(model)):
            assert (quantized(x) - want).abs().max() < 0.1 * want.abs().max()


def test_flop_split_linear_dominates_short_sequences_only():
    short = quantize.flop_split(quantize.build_classifier(TINY), tokens(4))
    assert short["linear"] > 10 * short["attention"] > 0
    long_size = quantize.Sizes(vocab=64, length=512, d_model=32, heads=2, layers=1)
    long = quantize.flop_split(quantize.build_classifier(long_size), tokens(1, long_size))
    assert long["attention"] > 0.5 * long["linear"]


def test_baseline_classifier_is_trained_once_cached_and_learns(tmp_path, monkeypatch):
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path))
    first = quantize.baseline_classifier(smoke=True, size=TINY)
    path = quantize.cache_path(True, TINY)
    assert path.exists() and str(path).startswith(str(tmp_path))
    again = quantize.baseline_classifier(smoke=True, size=TINY)
    assert all(
        torch.equal(a, b)
        for a, b in zip(first.state_dict().values(), again.state_dict().values(), strict=True)
    )
    split = text.encoded_headlines(TINY.length, TINY.vocab, smoke=True)
    assert quantize.accuracy_points(first, split.x_test, split.y_test) > 50  # chance is 25
    assert not first.training


@pytest.mark.skipif(not onnx_runtime.available(), reason="onnxruntime is not installed")
def test_onnx_export_and_int8_round_trip(tmp_path):
    model = quantize.build_classifier(TINY).eval()
    fp32 = quantize.export_onnx(model, tmp_path / "m.onnx", TINY)
    int8 = quantize.onnx_int8(fp32, tmp_path / "m.int8.onnx")
    x = tokens(5, seed=2)
    with torch.inference_mode():
        want = model(x)
    a, b = quantize.ort_classifier(fp32), quantize.ort_classifier(int8)
    assert (a(x) - want).abs().max() < 1e-4
    assert (b(x) - want).abs().max() < 0.3 * want.abs().max()  # per-tensor, untrained
    assert b.file_bytes < a.file_bytes / 2


# ---------------------------------------------------------------------------------------------
# The graders' checks, on the trained classifier (smoke size), fixed secret seed


def _torchao_int8(model):
    """The reference answer of exercise 1."""
    with captured_stderr():
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantized = copy.deepcopy(model)
        quantize_(quantized, Int8DynamicActivationInt8WeightConfig())
    return quantized


def _torchao_in_place(model):
    with captured_stderr():
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

        quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


def _float_copy(model):
    """The baseline-equivalent answer: no quantization."""
    return copy.deepcopy(model)


class _Memo(nn.Module):
    """Answers a repeated call on the same tensor from memory: the legacy int8 model made far
    faster than fp32 on the speed check's repeated batch, so contention cannot blur the result."""

    def __init__(self, model):
        super().__init__()
        self.model, self.last = model, None
        self.eval()  # a Module starts in training mode: the check restores it after scoring

    def forward(self, tokens):
        if self.last is None or self.last[0] is not tokens:
            self.last = (tokens, self.model(tokens))
        return self.last[1]


class _Twice(nn.Module):
    """A float copy that computes everything twice: clearly no faster than the baseline."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.eval()

    def forward(self, tokens):
        self.model(tokens)
        return self.model(tokens)


def _zeroed_head(model):
    """int8, but the classifier head zeroed: the accuracy collapses."""
    quantized = _legacy_int8(model)
    quantized.head = nn.Linear(quantized.head.in_features, quantized.head.out_features)
    nn.init.zeros_(quantized.head.weight)
    return quantized


@pytest.fixture
def graded(monkeypatch):
    """Smoke sizes, a fixed secret seed, the CPU track."""
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", SEED)
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu")


def test_check_torchao_grades_size_after_closeness(graded, capsys):
    assert quantize.check_torchao(_torchao_int8, points=2) == 2.0
    assert "torchao_size" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="changed the float model"):
        quantize.check_torchao(_torchao_in_place, points=2)
    with pytest.raises(checks.CheckFailed, match="memory_ratio 1;"):
        quantize.check_torchao(_float_copy, points=2)


def test_check_fast_size(graded):
    assert quantize.check_fast_size(_legacy_int8, points=1) == 1.0
    with pytest.raises(checks.CheckFailed, match="memory_ratio 1;"):
        quantize.check_fast_size(_float_copy, points=1)


def test_check_fast_speed_full_points_when_fast_and_accurate(graded):
    assert quantize.check_fast_speed(lambda m: _Memo(_legacy_int8(m)), points=4) == 4.0


def test_check_fast_speed_fails_a_lost_accuracy_before_timing(graded, capsys):
    with pytest.raises(checks.CheckFailed, match="accuracy_drop"):
        quantize.check_fast_speed(_zeroed_head, points=4)
    assert "fast_speedup" not in capsys.readouterr().out


def test_check_fast_speed_fails_a_float_model(graded, capsys):
    with pytest.raises(checks.CheckFailed, match="speedup"):
        quantize.check_fast_speed(lambda m: _Twice(_float_copy(m)), points=4)
    assert "accuracy_drop 0;" in capsys.readouterr().out  # the accuracy part passed


def test_check_fast_speed_where_speed_is_not_gradable_grades_int8_weights(graded, monkeypatch):
    import dataclasses

    unreachable = tuple(
        dataclasses.replace(row, floor=50.0, target=60.0) if row.check == "fast_speedup" else row
        for row in quantize.TARGETS
    )
    monkeypatch.setattr(quantize, "TARGETS", unreachable)  # no reference clears a 50x floor
    assert quantize.check_fast_speed(_legacy_int8, points=4) == 4.0
    with pytest.raises(checks.CheckFailed, match="memory_ratio"):
        quantize.check_fast_speed(_float_copy, points=4)


# Exercise 1, int8 by hand: the reference, and the answers a student might hand in instead.


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv(checks.SEED_ENV, SEED)


def _truncated(weight):
    _, scale = quantize.reference_quantize(weight)
    return torch.clamp(weight / scale[:, None], -127, 127).to(torch.int8), scale


def _fp32_returned(weight):  # "quantized" without int8: error 0 but nothing stored smaller
    return weight.clone(), torch.ones(weight.shape[0])


def _per_tensor_fake(x, weight, bias):
    return nn.functional.linear(
        x, quantize.reference_dequantize(*quantize.per_tensor_quantize(weight)), bias
    )


def _library_fake(x, weight, bias):  # torch's own per-channel fake quant: the same grid, allowed
    _, scale = quantize.reference_quantize(weight)
    zero = torch.zeros(weight.shape[0], dtype=torch.int32)
    fake = torch.fake_quantize_per_channel_affine(weight, scale, zero, 0, -127, 127)
    return nn.functional.linear(x, fake, bias)


def test_check_quantize_gives_the_reference_full_points(secret):
    q = quantize.reference_quantize
    assert quantize.check_quantize(q, quantize.reference_dequantize, points=3) == 3


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (_truncated, "differs from round"),
        (_fp32_returned, "int8"),
        (quantize.per_tensor_quantize, "max|w| / 127 per row"),
        (lambda w: quantize.reference_quantize(w)[0], "pair"),
    ],
    ids=["truncation", "fp32-returned", "per-tensor", "no-scale"],
)
def test_check_quantize_fails_wrong_answers_with_a_reason(secret, answer, message):
    with pytest.raises(checks.CheckFailed, match=message):
        quantize.check_quantize(answer, quantize.reference_dequantize, points=3)


def test_check_quantize_tries_dequantize_on_a_pair_it_did_not_produce(secret):
    cache = {}

    def quant(weight):
        cache["w"] = weight.clone()
        return quantize.reference_quantize(weight)

    def deq_returns_the_weight(q, scale):  # the cheat: hand back the original weight
        return cache["w"]

    with pytest.raises(checks.CheckFailed, match="dequantize"):
        quantize.check_quantize(quant, deq_returns_the_weight, points=3)


def test_check_fake_linear_reference_and_library_pass_per_tensor_and_fp32_fail(secret):
    assert quantize.check_fake_linear(quantize.reference_fake_linear, points=2) == 2
    assert quantize.check_fake_linear(_library_fake, points=2) == 2
    for wrong in (_per_tensor_fake, lambda x, w, b: nn.functional.linear(x, w, b)):
        with pytest.raises(checks.CheckFailed, match="per-channel fake-quantized"):
            quantize.check_fake_linear(wrong, points=2)


def test_per_channel_error_is_far_below_per_tensor_on_spread_rows():
    w, b = quantize.spread_layer(256, 64, torch.Generator().manual_seed(0))
    x = torch.randn(64, 64, generator=torch.Generator().manual_seed(1))
    _, per_channel = quantize.fake_linear_errors(quantize.reference_fake_linear, x, w, b)
    from ptcourse.core.numerics import relative_error

    per_tensor = relative_error(nn.functional.linear(x, w, b), _per_tensor_fake(x, w, b))
    assert per_tensor > 2 * per_channel  # 3.1-4.3x on seeds 0-2: the large rows dominate the norm
