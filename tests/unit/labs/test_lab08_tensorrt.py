import copy

import pytest
import torch
from torch import nn

from ptcourse.core import measure
from ptcourse.labs import lab08_tensorrt as fusion


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


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
        assert fusion.max_difference(fusion.reference_fold(conv, bn)(x), bn(conv(x))) < 1e-5
    model = fusion.deployed_model(0)
    fused = fusion.reference_fuse(model)
    x = torch.randn(1, 3, fusion.IMAGE, fusion.IMAGE, generator=g)
    with torch.no_grad():
        assert fusion.max_difference(fused(x), model(x)) < 1e-4
    assert fusion.count_batchnorms(fused) == 0 and fusion.count_batchnorms(model) == 4


def test_resnet_folds_every_batchnorm():
    model = fusion.resnet(0)
    fused = fusion.reference_fuse(model)
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        want = model(x)
        assert fusion.max_difference(fused(x), want) < 1e-4 * want.abs().max().item()
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

    class Bf16(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = copy.deepcopy(m).to(torch.bfloat16)

        def forward(self, x):
            return self.m(x.to(torch.bfloat16)).float()

    assert fusion.low_precision_share(Bf16(model), x) == 1.0


def test_precision_change_of_identity_conversion_is_zero(monkeypatch):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 3, 16, 16, generator=g)
    y = torch.randint(0, 4, (40,), generator=g)
    monkeypatch.setattr(fusion, "inspection_tensors", lambda side=16: (x, y, x, y))
    monkeypatch.setattr(fusion, "inspection_model", lambda seed=0: fusion.deployed_model(seed))
    change = fusion.precision_change(lambda m: m, batch=16)
    assert change.flipped == 0 and change.accuracy_drop == 0 and change.relative_error == 0
    assert change.images == 40 and change.output_dtype == torch.float32
    halved = fusion.precision_change(lambda m: m.to(torch.bfloat16).float(), batch=16)
    assert halved.relative_error > 0


def test_fast_bf16_agrees_with_the_machine_probe():
    from ptcourse.core import hardware

    assert fusion.fast_bf16() == hardware.machine().fast_bf16
