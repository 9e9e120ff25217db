"""Unit tests of ptcourse.labs.lab05_efficient_blocks: the graders' counts, the classifier, the
training run, and the four checks on a right, a wrong and a baseline-equivalent answer (smoke
inspection set, fixed secret seed)."""

import dataclasses

import pytest
import torch
from torch import nn

from ptcourse.assets import datasets
from ptcourse.core import measure
from ptcourse.grading.checks import CheckFailed
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


def test_baseline_block_counts():
    block = blocks.baseline_block(8, 16, 2).eval()
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
    a = blocks.train_and_evaluate(blocks.baseline_block, 3, size, smoke=True)
    b = blocks.train_and_evaluate(blocks.baseline_block, 3, size, smoke=True)
    assert a == b
    assert 0.0 <= a <= 1.0


def test_sizes_follow_smoke_mode(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = blocks.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = blocks.sizes()
    assert smoke.channels < full.channels
    assert smoke.plateau.train.steps < full.plateau.train.steps
    assert smoke.train == full.train  # the graded run is the same in smoke mode
    assert full.plateau.train.steps > full.train.steps and len(full.plateau.seeds) >= 3
    assert "training" in str(full) and "plateau" in str(full)


def test_batches_are_seeded_and_cover_the_epoch():
    x, y = torch.arange(10.0).reshape(10, 1, 1, 1).expand(10, 3, 2, 2), torch.arange(10)
    size = blocks.TrainSize(image=2, steps=4, batch=5, widths=(8,))
    first = list(blocks._batches(x, y, size, seed=1))
    again = list(blocks._batches(x, y, size, seed=1))
    assert [b[1].tolist() for b in first] == [b[1].tolist() for b in again]
    assert len(first) == 4 and all(len(b[1]) == 5 for b in first)
    assert sorted(first[0][1].tolist() + first[1][1].tolist()) == list(range(10))  # one epoch


def test_warmup_cosine_rises_then_decays_to_zero():
    factors = [blocks.warmup_cosine(step, warmup=4, steps=20) for step in range(20)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0 and all(a >= b for a, b in zip(factors[4:], factors[5:], strict=False))
    assert factors[-1] < 0.01


def test_plateau_curve_is_seeded_and_records_the_curve():
    size = blocks.PlateauSize(blocks.TrainSize(32, 6, 16, (8,), lr=3e-3), (0,), every=2, warmup=2)
    a = blocks.plateau_curve(blocks.baseline_block, 5, size, smoke=True)
    b = blocks.plateau_curve(blocks.baseline_block, 5, size, smoke=True)
    assert a.steps == (2, 4, 6) and a.accuracy == b.accuracy
    assert a.final == a.accuracy[-1] and a.at(5) == a.accuracy[1] and a.seconds > 0


def test_train_to_plateau_runs_every_seed_and_prints_each_run(capsys):
    size = blocks.PlateauSize(blocks.TrainSize(32, 2, 8, (8,)), (0, 1), every=2, warmup=1)
    runs = blocks.train_to_plateau("standard", blocks.baseline_block, size, smoke=True)
    assert len(runs) == 2 and capsys.readouterr().out.count("standard test accuracy") == 2
    found = blocks.plateau_of({"standard": runs, "efficient": runs}, size, smoke=True)
    _, _, x_test, _ = datasets.inspection_tensors(32, "image", smoke=True)
    assert found.drops() == [0.0, 0.0] and found.test_images == len(x_test)


def _plateau(standard: list[float], efficient: list[float]) -> blocks.Plateau:
    def curves(finals):
        return tuple(blocks.Curve((50, 100), (f - 0.01, f), 1.0) for f in finals)

    return blocks.Plateau(
        (0, 1, 2), {"standard": curves(standard), "efficient": curves(efficient)}, 480
    )


def test_plateau_reports_each_seed_the_drops_spread_and_the_late_gain():
    found = _plateau([0.90, 0.92, 0.91], [0.88, 0.915, 0.90])
    assert [round(d, 3) for d in found.drops()] == [0.02, 0.005, 0.01]
    assert found.late_gain("standard") == pytest.approx(0.01)
    table = blocks.plateau_table(found)
    assert "+0.5 to +2.0 points" in table and "0.21 points" in table
    assert len(table.splitlines()) == 6  # header, 3 seeds, the spread, the late gains


@pytest.mark.parametrize(
    ("drops", "verdict"),
    [
        ([0.0, 0.002, -0.01], "held here on every seed"),
        ([0.02, 0.05, 0.004], "did not hold here on any seed"),
        ([0.02, -0.01, 0.001], "the seeds disagree"),
    ],
)
def test_claim_verdict_follows_the_measured_drops(monkeypatch, drops, verdict):
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    sentence = blocks.claim_verdict(drops)
    assert verdict in sentence and "0.3 points" in sentence and "Smoke" not in sentence
    assert f"{min(drops) * 100:+.1f} to {max(drops) * 100:+.1f}" in sentence


def test_claim_verdict_says_smoke_numbers_are_not_a_result(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    assert "not a result" in blocks.claim_verdict([0.01, 0.02, 0.03])


def test_training_reads_the_shared_inspection_tensors():
    x_train, y_train, x_test, y_test = datasets.inspection_tensors(32, "image", smoke=True)
    assert x_train.shape[1:] == (3, 32, 32) and len(x_test) == len(y_test)
    means, stds = x_train.mean(dim=(1, 2, 3)), x_train.std(dim=(1, 2, 3))
    assert torch.allclose(means, torch.zeros_like(means), atol=1e-5)
    assert torch.allclose(stds, torch.ones_like(stds), atol=1e-4)


# ---------------------------------------------------------------------------------------------
# The checks


class Baseline(nn.Module):
    """Baseline-equivalent answer: the standard block pasted as the exercise."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.body = blocks.baseline_block(c_in, c_out, stride)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class NoSqueeze(Reference):
    """Wrong: the block without its squeeze-and-excitation (too few parameters)."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__(c_in, c_out, stride)
        del self.squeeze, self.excite

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.bn2(self.pointwise(self.act(self.bn1(self.depthwise(x))))))


class DepthwiseEightTimes(Reference):
    """Wrong but the specified parameters: runs its depthwise conv 8 times (more FLOPs)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(7):  # and once more in the block itself
            x = self.depthwise(x)
        return super().forward(x)


class IgnoresInput(Reference):
    """Wrong: the specified block whose output does not depend on its input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.zeros_like(x))


def reference_flops(c_in, c_out, height, width, stride=1, batch=1):
    return blocks.expected_flops("efficient", c_in, c_out, height, width, stride, batch).total


def without_se_flops(c_in, c_out, height, width, stride=1, batch=1):
    return blocks.expected_flops("efficient", c_in, c_out, height, width, stride, batch).counted


def standard_flops(c_in, c_out, height, width, stride=1, batch=1):
    return blocks.expected_flops("standard", c_in, c_out, height, width, stride, batch).counted


@pytest.fixture
def graded(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", "1234")
    monkeypatch.delenv("PTCOURSE_RESULTS", raising=False)


def test_block_check_full_marks_for_the_specified_block(graded, capsys):
    assert blocks.check_block(Reference, points=2) == 2
    assert "exact on 4 fresh configurations" in capsys.readouterr().out


@pytest.mark.parametrize("block", [NoSqueeze, Baseline])
def test_block_check_fails_other_blocks(graded, block):
    with pytest.raises(CheckFailed, match="parameters"):
        blocks.check_block(block, points=2)


def test_flops_formula_check_full_marks_for_the_right_formula(graded):
    assert blocks.check_flops_formula(reference_flops, points=1) == 1


@pytest.mark.parametrize("formula", [without_se_flops, standard_flops])
def test_flops_formula_check_fails_other_formulas(graded, formula):
    with pytest.raises(CheckFailed, match="expected"):
        blocks.check_flops_formula(formula, points=1)


def test_flops_ratio_check_full_marks_for_the_specified_block(graded):
    assert blocks.check_flops_ratio(Reference, points=2) == 2


def test_flops_ratio_check_partial_credit_for_extra_flops(graded):
    # 9 * 128 / (8 * 9 + 128) = 5.8x fewer FLOPs: (5.8 - 1.5) / (8 - 1.5) of the points
    assert 1.2 < blocks.check_flops_ratio(DepthwiseEightTimes, points=2) < 1.4


def test_flops_ratio_check_fails_the_standard_block(graded):
    with pytest.raises(CheckFailed, match="not the block"):
        blocks.check_flops_ratio(Baseline, points=2)


def test_accuracy_check_full_marks_for_the_specified_block(graded):
    # the graded run itself (150 steps on the smoke set): about half a minute on one core
    assert blocks.check_accuracy(Reference, points=2) == 2


@pytest.fixture
def short_training(graded, monkeypatch):
    """The accuracy check on a 4-step run: a block that cannot learn still scores chance."""
    full = blocks.sizes()
    short = dataclasses.replace(full, train=dataclasses.replace(full.train, steps=4))
    monkeypatch.setattr(blocks, "sizes", lambda: short)


def test_accuracy_check_baseline_trains_exactly_as_the_standard_block(short_training, capsys):
    try:
        earned = blocks.check_accuracy(Baseline, points=2)
    except CheckFailed:  # 4 steps may not reach the accuracy floor
        earned = None
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("test accuracy"))
    standard, yours = (float(part.split()[-1]) for part in line.split(","))
    assert standard == yours  # same block, same seed: no drop
    assert earned is None or earned >= 1


def test_accuracy_check_grades_the_best_of_three_runs_when_a_seed_falls_short(graded, monkeypatch):
    # seed 1042 of a smoke sweep: the reference block 0.375, the standard block 0.703
    runs = iter([{"efficient": 0.375, "standard": 0.703}, {"efficient": 0.5, "standard": 0.6}])
    monkeypatch.setattr(blocks, "accuracies", lambda block, seed: next(runs))
    assert blocks.check_accuracy(Reference, points=2) == 2


def test_accuracy_check_a_run_below_the_floor_never_outranks_one_above_it(graded, monkeypatch):
    # the first run learns too little (fails `accuracy`) but keeps up with a standard block that
    # also failed; the second learns and drops more than the target: partial credit, not zero
    runs = [
        {"efficient": 0.33, "standard": 0.28},  # drop -0.05: full credit for that half alone
        {"efficient": 0.35, "standard": 0.80},  # a quarter and about a quarter of each half
        {"efficient": 0.25, "standard": 0.70},
    ]
    monkeypatch.setattr(blocks, "accuracies", lambda block, seed: runs.pop(0))
    assert 0 < blocks.check_accuracy(Reference, points=2) < 2


class Detached(Reference):
    def forward(self, x):
        return super().forward(x).detach()


def test_accuracy_check_fails_a_block_the_gradient_never_reaches(short_training):
    # a smoke sweep of 60 seeds: such a classifier still scored 0.281 median, 0.406 at most
    with pytest.raises(CheckFailed, match="did not change in training"):
        blocks.check_accuracy(Detached, points=2)


def test_accuracy_check_fails_a_block_that_ignores_its_input(short_training):
    with pytest.raises(CheckFailed, match="did not change in training"):
        blocks.check_accuracy(IgnoresInput, points=2)
