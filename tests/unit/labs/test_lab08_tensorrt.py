import copy
import os

import pytest
import torch
from torch import nn

from ptcourse.core import measure, numerics
from ptcourse.grading import checks
from ptcourse.labs import lab08_tensorrt as fusion


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


@pytest.fixture
def graded(monkeypatch):
    """Smoke mode and a fixed secret seed, as the graders run in the tests."""
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv(checks.SEED_ENV, "3")


class Bf16(nn.Module):
    """The reference to_bf16: bf16 weights and activations, float32 in and out."""

    def __init__(self, model: nn.Module, out_dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.inner = copy.deepcopy(model).to(torch.bfloat16)
        self.out_dtype = out_dtype

    def forward(self, x):
        return self.inner(x.to(torch.bfloat16)).to(self.out_dtype)


def to_bf16(model):
    return Bf16(model).eval()


class Affine(nn.Module):
    """BatchNorm's eval-mode arithmetic under another name: not counted as a BatchNorm."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        super().__init__()
        self.eps = bn.eps
        for name in ("running_mean", "running_var", "weight", "bias"):
            self.register_buffer(name, getattr(bn, name).detach().clone())

    def forward(self, x):
        return nn.functional.batch_norm(
            x, self.running_mean, self.running_var, self.weight, self.bias, False, 0.0, self.eps
        )


def rename_batchnorms(model):
    """A baseline-equivalent 'fusion': every BatchNorm still runs, as an ``Affine`` module."""
    model = copy.deepcopy(model).eval()
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.BatchNorm2d):
            model.set_submodule(name, Affine(module))
    return model


def drop_batchnorms(model):
    """A wrong fusion: BatchNorms removed, nothing folded."""
    model = copy.deepcopy(model).eval()
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.BatchNorm2d):
            model.set_submodule(name, nn.Identity())
    return model


class OrtModel(nn.Module):
    """A right and clearly faster fusion for timing under load: ONNX Runtime at level "all"."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        side = fusion.sizes().image
        self.session = fusion.reference_optimized(
            fusion.export(model, torch.zeros(1, 3, side, side)), "all", os.devnull
        )

    def forward(self, x):
        from ptcourse.assets import onnx_runtime

        return onnx_runtime.run(self.session, x)


def scores_zero(check, answer, points, tries=2):
    """Whether a baseline-equivalent answer scores 0 on a timing check: it takes the baseline's
    time, so only noise lifts it above the floor; under a heavily loaded machine it gets a
    second try (identical code twice above the floor would be a real failure)."""
    for _ in range(tries):
        try:
            check(answer, points=points)
        except checks.CheckFailed as failed:
            assert "zero credit" in str(failed)
            return True
    return False


# ---------------------------------------------------------------------------------------------
# Helpers


def test_sizes_are_the_same_models_in_smoke_and_full(monkeypatch):
    monkeypatch.delenv("PTCOURSE_SMOKE", raising=False)
    full = fusion.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = fusion.sizes()
    assert (smoke.channels, smoke.image, smoke.probe_image) == (full.channels, full.image, 64)
    assert smoke.run_time_s < full.run_time_s


def test_deployed_model_has_nontrivial_batchnorm_and_is_seeded():
    a, b = fusion.deployed_model(3), fusion.deployed_model(3)
    assert not a.training and fusion.count_batchnorms(a) == 4
    pairs = zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    assert all(torch.equal(p, q) for p, q in pairs)
    bn = a[0][1]
    assert bn.running_var.min() > 0 and (bn.running_mean.abs() > 1e-3).any()


def test_reference_fold_and_fuse_keep_outputs_and_remove_batchnorm():
    g = torch.Generator().manual_seed(0)
    conv = nn.Conv2d(3, 6, 3, padding=1, bias=False)
    bn = fusion.randomize_batchnorm(nn.BatchNorm2d(6), g).eval()
    x = torch.randn(2, 3, 8, 8, generator=g)
    with torch.no_grad():
        assert numerics.max_abs_error(fusion.reference_fold(conv, bn)(x), bn(conv(x))) < 1e-5
    model = fusion.deployed_model(0)
    fused = fusion.reference_fuse(model)
    side = fusion.sizes().image
    x = torch.randn(1, 3, side, side, generator=g)
    with torch.no_grad():
        assert numerics.max_abs_error(fused(x), model(x)) < 1e-4
    assert fusion.count_batchnorms(fused) == 0 and fusion.count_batchnorms(model) == 4


def test_resnet_folds_every_batchnorm():
    model = fusion.resnet(0)
    fused = fusion.reference_fuse(model)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        assert numerics.max_abs_error(fused(x), want) < 1e-4 * want.abs().max().item()
    assert fusion.count_batchnorms(fused) == 0


def test_op_counts_names_contrib_domains():
    from onnx import helper

    node = helper.make_node("FusedConv", ["x", "w"], ["y"], domain="com.microsoft")
    relu = helper.make_node("Relu", ["y"], ["z"])
    graph = helper.make_graph([node, relu], "g", [], [])
    model = helper.make_model(graph)
    counts = fusion.op_counts(model)
    assert counts == {"com.microsoft.FusedConv": 1, "Relu": 1}
    assert fusion.op_counts(model.SerializeToString()) == counts


def test_low_precision_share_sees_bf16_and_fp32():
    model = fusion.deployed_model(0)
    x = torch.randn(1, 3, 16, 16)
    assert fusion.low_precision_share(model, x) == 0.0
    assert fusion.low_precision_share(to_bf16(model), x) == 1.0


def test_precision_change_of_identity_conversion_is_zero(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, 16, 16, generator=g)
    y = torch.randint(0, 4, (40,), generator=g)
    monkeypatch.setattr(fusion.datasets, "inspection_tensors", lambda *args, **kw: (x, y, x, y))
    monkeypatch.setattr(fusion, "inspection_model", lambda seed=0: fusion.deployed_model(seed))
    change = fusion.precision_change(lambda m: m, batch=16)
    assert change.flipped == 0 and change.accuracy_drop == 0 and change.relative_error == 0
    assert change.images == 40 and change.output_dtype == torch.float32
    halved = fusion.precision_change(lambda m: m.to(torch.bfloat16).float(), batch=16)
    assert halved.relative_error > 0


def test_inspection_model_is_a_real_classifier(graded):
    change = fusion.precision_change(fusion.baseline_to_bf16, seed=0)
    assert change.images == 64 and change.accuracy_drop == 0 and change.flipped == 0
    assert 0.3 < change.accuracy_fp32 < 0.5  # 4 classes: above chance, weak


def test_fast_bf16_agrees_with_the_machine_probe():
    from ptcourse.core import hardware

    assert fusion.fast_bf16() == hardware.machine().fast_bf16


# ---------------------------------------------------------------------------------------------
# Checks: a right answer, a wrong one, a baseline-equivalent one


def test_check_fold(graded):
    assert fusion.check_fold(fusion.reference_fold, points=1) == 1.0

    def forgets_conv_bias(conv, bn):
        return fusion.reference_fold(_no_bias(conv), bn)

    with pytest.raises(checks.CheckFailed, match="fold_bn"):
        fusion.check_fold(forgets_conv_bias, points=1)
    with pytest.raises(checks.CheckFailed, match="fold_bn"):
        fusion.check_fold(lambda conv, bn: copy.deepcopy(conv), points=1)  # nothing folded


def _no_bias(conv):
    conv = copy.deepcopy(conv)
    conv.bias = None
    return conv


def test_check_fuse(graded):
    assert fusion.check_fuse(fusion.reference_fuse, points=1) == 1.0
    with pytest.raises(checks.CheckFailed, match="tiny CNN logits"):
        fusion.check_fuse(drop_batchnorms, points=1)
    with pytest.raises(checks.CheckFailed, match="BatchNorm modules are left"):
        fusion.check_fuse(fusion.baseline_fuse_conv_bn, points=1)

    def in_place(model):
        fused = fusion.reference_fuse(model)
        model[0][1].running_mean.zero_()
        return fused

    with pytest.raises(checks.CheckFailed, match="changed the model it was given"):
        fusion.check_fuse(in_place, points=1)


def test_reference_fuse_conv_bn_folds_tiny_cnn_and_resnet():
    for model in (fusion.deployed_model(0), fusion.resnet(0)):
        fused = fusion.reference_fuse_conv_bn(model)
        x = torch.randn(1, 3, 32, 32)
        with torch.no_grad():
            want = model(x)
            assert numerics.max_abs_error(fused(x), want) < 1e-4 * want.abs().max().item()
        assert fusion.count_batchnorms(fused) == 0 and fusion.count_batchnorms(model) > 0


def hand_written_batchnorms(model):
    """A baseline-equivalent 'fusion': every BatchNorm still runs, as elementwise arithmetic."""

    class Elementwise(Affine):
        def forward(self, x):
            shape = (1, -1, 1, 1)
            scale = self.weight.view(shape) / torch.sqrt(self.running_var.view(shape) + self.eps)
            return (x - self.running_mean.view(shape)) * scale + self.bias.view(shape)

    model = copy.deepcopy(model).eval()
    for name, module in list(model.named_modules()):
        if isinstance(module, nn.BatchNorm2d):
            model.set_submodule(name, Elementwise(module))
    return model


def half_folded(model):
    """2 of the deployed model's 4 BatchNorms folded, the others kept under another name."""
    return nn.Sequential(fusion.reference_fuse_conv_bn(model[:2]), rename_batchnorms(model[2:]))


def test_folded_share():
    net = fusion.deployed_model(0)
    x = torch.randn(1, 3, 32, 32)
    assert fusion.folded_share(net, fusion.reference_fuse_conv_bn(net), x) == 1.0
    assert fusion.folded_share(net, OrtModel(net), x) == 1.0  # no aten work at all
    assert fusion.folded_share(net, fusion.baseline_fuse_conv_bn(net), x) == 0.0
    assert fusion.folded_share(net, rename_batchnorms(net), x) == 0.0
    assert fusion.folded_share(net, hand_written_batchnorms(net), x) == 0.0
    assert fusion.folded_share(net, half_folded(net), x) == 0.5


def test_check_fusion_speed(graded):
    # the right answer, graded against the reference timed in the same run; ORT (~5x) is clear
    # of any load and earns full points whether speed is gradable here or not
    assert fusion.check_fusion_speed(OrtModel, points=3) == 3.0
    with pytest.raises(checks.CheckFailed, match="BatchNorm modules are left"):
        fusion.check_fusion_speed(fusion.baseline_fuse_conv_bn, points=3)
    with pytest.raises(checks.CheckFailed, match="fused logits"):
        fusion.check_fusion_speed(drop_batchnorms, points=3)
    # BatchNorm's arithmetic under another name is not timed: it folds nothing
    with pytest.raises(checks.CheckFailed, match="nothing folded"):
        fusion.check_fusion_speed(rename_batchnorms, points=3)


def test_check_fusion_speed_not_gradable_grades_bn_folded(graded, monkeypatch, capsys):
    def reference_is_slow(goal, baseline, reference, candidate, *, points, not_gradable):
        return not_gradable("[test] the reference does not clear the floor here")

    monkeypatch.setattr(fusion.checks, "relative_speedup", reference_is_slow)
    assert fusion.check_fusion_speed(fusion.reference_fuse_conv_bn, points=3) == 3.0
    assert "bn_folded" in capsys.readouterr().out
    for unfolded in (rename_batchnorms, hand_written_batchnorms):
        with pytest.raises(checks.CheckFailed, match="bn_folded|nothing folded"):
            fusion.check_fusion_speed(unfolded, points=3)
    assert fusion.check_fusion_speed(half_folded, points=3) == 1.5


def test_check_ort(graded):
    assert fusion.check_ort(fusion.reference_optimized, points=2) == 2.0

    def no_file(onnx_model, optimization, path):
        return fusion.reference_optimized(onnx_model, optimization, os.devnull)

    with pytest.raises(checks.CheckFailed, match="no optimised graph written"):
        fusion.check_ort(no_file, points=2)

    def always_basic(onnx_model, optimization, path):
        return fusion.reference_optimized(onnx_model, "basic", path)

    with pytest.raises(checks.CheckFailed, match="all: graph"):
        fusion.check_ort(always_basic, points=2)


def test_check_bf16_accuracy(graded):
    assert fusion.check_bf16_accuracy(to_bf16, points=2) == 2.0
    # not a speed check: an fp32 copy changes nothing and keeps the points
    assert fusion.check_bf16_accuracy(fusion.baseline_to_bf16, points=2) == 2.0
    with pytest.raises(checks.CheckFailed, match="float32 logits"):
        fusion.check_bf16_accuracy(lambda m: Bf16(m, torch.bfloat16), points=2)

    def broken(model):
        model = copy.deepcopy(model)
        model[-1].weight.data.mul_(-1)  # the head's sign flipped: predictions nonsense
        return to_bf16(model)

    with pytest.raises(checks.CheckFailed, match="far from fp32"):
        fusion.check_bf16_accuracy(broken, points=2)


def test_check_bf16_in_effect_where_bf16_is_slow(graded, monkeypatch):
    monkeypatch.setattr(fusion, "fast_bf16", lambda: False)
    assert fusion.check_bf16_speed(to_bf16, points=2) == 2.0
    with pytest.raises(checks.CheckFailed, match="bf16_in_effect"):
        fusion.check_bf16_speed(fusion.baseline_to_bf16, points=2)

    def head_only(model):
        model = copy.deepcopy(model)
        model[-1] = Bf16(model[-1])
        return model

    assert 0 < fusion.check_bf16_speed(head_only, points=2) < 2.0  # 1 of 5 layers: partial


@pytest.mark.skipif(not fusion.fast_bf16(), reason="bf16 speed is graded only with bf16 hardware")
def test_check_bf16_speed_with_bf16_hardware(graded):
    assert fusion.check_bf16_speed(to_bf16, points=2) == 2.0  # ~2.6x on Zen 4
    assert scores_zero(fusion.check_bf16_speed, fusion.baseline_to_bf16, 2)


# ---------------------------------------------------------------------------------------------
# In the judge: the answers run in a worker; structure, sessions and files are read there


@pytest.fixture
def worker(lab_worker):
    """A judge's worker (sandboxed where bubblewrap is) holding the reference answers."""
    cell = (
        "from ptcourse.labs import lab08_tensorrt as fusion\n"
        "fuse_conv_bn = fusion.reference_fuse_conv_bn\n"
        "optimized_session = fusion.reference_optimized\n"
        "def fuse_unfused(model):\n"
        "    return fusion.baseline_fuse_conv_bn(model)\n"
    )
    return lab_worker(cell, {"PTCOURSE_SMOKE": "1"})


def test_judged_checks_read_structure_and_graphs_in_the_worker(worker, graded):
    from ptcourse.judge.remote import Remote

    fuse, session, unfused = (
        worker.request("lookup", name)
        for name in ("fuse_conv_bn", "optimized_session", "fuse_unfused")
    )
    assert isinstance(fuse, Remote)
    assert fusion.check_fuse(fuse, points=1) == 1.0
    # the BatchNorms left are counted in the worker (the judge cannot see a Remote's modules)
    with pytest.raises(checks.CheckFailed, match="BatchNorm modules are left"):
        fusion.check_fuse(unfused, points=1)
    # the session and the graph file are made in the worker; the graph comes back as bytes
    assert fusion.check_ort(session, points=2) == 2.0
    net = fusion.deployed_model(0)
    share = fusion.folded_share(net, fuse(net), torch.randn(1, 3, 32, 32))
    assert share == 1.0
