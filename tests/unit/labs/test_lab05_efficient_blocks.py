import pytest
import torch
from torch import nn

from ptcourse.core import measure
from ptcourse.labs import lab05_efficient_blocks as blocks


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


class Reference(nn.Module):
    """The lab's exercise, solved, for testing the graders' counts."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        r = blocks.se_channels(c_in)
        self.depthwise = nn.Conv2d(c_in, c_in, 3, stride, 1, groups=c_in, bias=False)
        self.bn1 = nn.BatchNorm2d(c_in)
        self.squeeze = nn.Conv2d(c_in, r, 1)
        self.excite = nn.Conv2d(r, c_in, 1)
        self.pointwise = nn.Conv2d(c_in, c_out, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn1(self.depthwise(x)))
        gate = torch.sigmoid(self.excite(self.act(self.squeeze(x.mean((2, 3), keepdim=True)))))
        return self.act(self.bn2(self.pointwise(x * gate)))


class LinearSE(Reference):
    """The same block with the SE written with Linear layers and adaptive pooling."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__(c_in, c_out, stride)
        r = blocks.se_channels(c_in)
        self.squeeze, self.excite = nn.Linear(c_in, r), nn.Linear(r, c_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.bn1(self.depthwise(x)))
        s = nn.functional.adaptive_avg_pool2d(x, 1).flatten(1)
        gate = torch.sigmoid(self.excite(self.act(self.squeeze(s))))[:, :, None, None]
        return self.act(self.bn2(self.pointwise(x * gate)))


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("build", [Reference, LinearSE])
@pytest.mark.parametrize(
    ("c_in", "c_out", "side", "stride", "batch"), [(16, 32, 15, 2, 3), (40, 24, 8, 1, 1)]
)
def test_expected_counts_match_measurement(build, c_in, c_out, side, stride, batch):
    block = build(c_in, c_out, stride).eval()
    x = torch.randn(batch, c_in, side, side)
    assert _params(block) == blocks.expected_parameters("efficient", c_in, c_out)
    want = blocks.expected_flops("efficient", c_in, c_out, side, side, stride, batch)
    assert measure.count_flops(lambda: block(x)) == want.counted
    assert blocks.uncounted_flops(lambda: block(x)) == want.uncounted
    out_side = blocks.out_size(side, stride)
    assert block(x).shape == (batch, c_out, out_side, out_side)


def test_standard_block_counts():
    block = blocks.standard_block(8, 16, 2).eval()
    x = torch.randn(2, 8, 9, 11)
    assert _params(block) == blocks.expected_parameters("standard", 8, 16)
    want = blocks.expected_flops("standard", 8, 16, 9, 11, 2, 2)
    assert measure.count_flops(lambda: block(x)) == want.counted
    assert want.uncounted == 0 and blocks.uncounted_flops(lambda: block(x)) == 0
    assert block(x).shape == (2, 16, 5, 6)


def test_flops_ratio_near_eight_at_128_channels():
    std = blocks.expected_flops("standard", 128, 128, 56, 56).counted
    eff = blocks.expected_flops("efficient", 128, 128, 56, 56).counted
    assert 8.3 < std / eff < 8.5


def test_count_bytes_of_one_conv():
    conv = nn.Conv2d(4, 8, 3, padding=1, bias=False)
    x = torch.randn(1, 4, 10, 10)
    expected = 4 * (x.numel() + conv.weight.numel() + 8 * 10 * 10)
    assert blocks.count_bytes(lambda: conv(x)) == expected
    assert blocks.count_bytes(lambda: x.view(-1)) == 0  # views move nothing


def test_classifier_downsamples_progressively():
    model = blocks.classifier(Reference, (8, 16))
    assert model(torch.randn(2, 3, 32, 32)).shape == (2, 4)
    strides = [m.stride[0] for m in model.modules() if isinstance(m, nn.Conv2d) and m.groups > 1]
    assert strides == [2, 1, 2, 1]


def test_unknown_kind_raises():
    with pytest.raises(ValueError):
        blocks.expected_parameters("fancy", 1, 1)


def test_training_is_seeded_and_learns():
    size = blocks.TrainSize(image=32, steps=4, batch=16, widths=(8,))
    a = blocks.train_and_evaluate(blocks.standard_block, 3, size, smoke=True)
    b = blocks.train_and_evaluate(blocks.standard_block, 3, size, smoke=True)
    assert a == b
    assert 0.0 <= a <= 1.0
