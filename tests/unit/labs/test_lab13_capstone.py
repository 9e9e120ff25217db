"""Lab 13 (capstone): the lots, the stage timer, the two lines, the report checks and the
graders, against right answers (the reference line), the baseline line and cheats."""

import io
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from ptcourse.assets import models
from ptcourse.grading import checks
from ptcourse.labs import lab13_capstone as capstone

SEED = 7


def lot(number, size=8):
    return capstone.inspection_lot(SEED, number, size)


@pytest.fixture(scope="module")
def detector():
    return models.inspection_detector()


@pytest.fixture(scope="module")
def small_lot():
    return lot(0)


@pytest.fixture(scope="module")
def both_lines(detector, small_lot):
    """The baseline's and the reference line's reports on one small lot."""
    baseline = capstone.BaselineLine(detector)(small_lot.frames)
    reference = capstone.ReferenceLine(detector)(small_lot.frames)
    return baseline, reference


def report(kind, regions=()):
    return {"defective": kind != "clean", "kind": kind, "regions": [list(r) for r in regions]}


def sorted_regions(reports):
    return [sorted(r["regions"]) for r in reports]


# ---------------------------------------------------------------------------------------------
# Answers: right ones, the baseline, and cheats


class ThreeStages(capstone.ReferenceLine):
    """The reference line with decode and preprocess timed as one stage."""

    def __call__(self, frames, timer=None):
        timer = capstone.StageTimer() if timer is None else timer
        if self.folded is None:
            self.folded = capstone.fold_for_inference(self.model)
        with timer.stage("decode"):
            x = capstone.batch_input(np.stack([capstone.small_frame(f) for f in frames]))
        with timer.stage("model"), torch.inference_mode():
            maps = self.folded(x)
        with timer.stage("post"):
            return capstone.reports_of(maps)


class UntimedWork(capstone.ReferenceLine):
    """The reference line, then as long again of work outside any stage."""

    def __call__(self, frames, timer=None):
        start = time.perf_counter()
        reports = super().__call__(frames, timer)
        time.sleep(time.perf_counter() - start)
        return reports


class FabricatedSeconds(capstone.ReferenceLine):
    """The reference line, reporting stage times it made up."""

    def __call__(self, frames, timer=None):
        timer = capstone.StageTimer() if timer is None else timer
        reports = super().__call__(frames, timer)
        timer.seconds = dict.fromkeys(capstone.STAGES, 1e-6)
        return reports


def all_clean(frames, timer=None):
    """Every frame clean, each stage timed (and instant)."""
    timer = capstone.StageTimer() if timer is None else timer
    for stage in capstone.STAGES:
        with timer.stage(stage):
            pass
    return [report("clean") for _ in frames]


def every_kind_flipped(reports):
    """Clean frames called scratches, each defect called the next kind; regions kept."""
    flipped = []
    for r in reports:
        if r["defective"]:
            kind = capstone.KINDS[capstone.KINDS.index(r["kind"]) % 3 + 1]
            flipped.append(report(kind, r["regions"]))
        else:
            flipped.append(report("scratch"))
    return flipped


# ---------------------------------------------------------------------------------------------
# Lots and the stage timer


def test_inspection_lot_is_seeded_half_clean_and_made_of_camera_jpegs():
    a, b, other = lot(3, 6), lot(3, 6), lot(4, 6)
    assert a.frames == b.frames and a.labels == b.labels
    assert len(a.frames) == len(a.labels) == 6
    assert a.labels.count(0) == 3 and all(1 <= k <= 3 for k in a.labels if k)
    assert not set(a.frames) & set(other.frames)
    for data in a.frames:
        image = Image.open(io.BytesIO(data))
        assert image.format == "JPEG" and image.size == (capstone.CAMERA, capstone.CAMERA)
    assert capstone.inspection_lot(SEED + 1, 3, 6).frames != a.frames


def test_stage_timer_sums_repeated_stages_and_tabulates_them(monkeypatch):
    ticks = iter([0.0, 1.0, 10.0, 12.0, 20.0, 20.5])
    monkeypatch.setattr(capstone, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    timer = capstone.StageTimer()
    with timer.stage("decode"):
        pass
    with pytest.raises(ValueError), timer.stage("decode"):  # an error still counts
        raise ValueError
    with timer.stage("model"):
        pass
    assert timer.seconds == {"decode": 3.0, "model": 0.5}
    table = timer.table(7.0).splitlines()
    assert [line.split()[0] for line in table] == ["decode", "model", "sum", "measured"]
    assert table[0].split()[1:] == ["3", "s", "42.9%"]
    assert table[2].split()[1:] == ["3.5", "s", "50.0%"]
    assert table[3].split()[1:] == ["7", "s"]
    assert timer.table().splitlines()[-1].split()[1:] == ["3.5", "s", "100.0%"]


# ---------------------------------------------------------------------------------------------
# The two lines


def test_stage_timer_tabulates_nothing_timed():
    assert "sum" in capstone.StageTimer().table()


def test_baseline_and_reference_lines_agree_on_a_small_lot(both_lines, small_lot):
    baseline, reference = both_lines
    n = len(small_lot.frames)
    assert capstone.valid_reports(baseline, n) is baseline
    assert capstone.valid_reports(reference, n) is reference
    same = sum(b["kind"] == r["kind"] for b, r in zip(baseline, reference, strict=True))
    assert same >= n - 1, ([b["kind"] for b in baseline], [r["kind"] for r in reference])
    assert any(r["regions"] for r in reference)
    assert capstone.region_iou(baseline, reference) >= capstone.MIN_REGION_IOU


def test_vectorised_reports_equal_the_python_loops(detector, small_lot):
    images = [capstone.full_frame(data) for data in small_lot.frames[:4]]
    with torch.no_grad():
        maps = detector(torch.cat([capstone.baseline_input(image) for image in images]))
    loops = [capstone.report_of(m) for m in maps]
    vectorised = capstone.reports_of(maps)
    assert any(r["regions"] for r in loops)
    assert [r["kind"] for r in vectorised] == [r["kind"] for r in loops]
    assert [r["defective"] for r in vectorised] == [r["defective"] for r in loops]
    assert sorted_regions(vectorised) == sorted_regions(loops)


# ---------------------------------------------------------------------------------------------
# Reading reports


GOOD = [report("clean"), report("spot", [(0, 0, 2, 3), (5, 5, 128, 128)])]


@pytest.mark.parametrize(
    ("reports", "says"),
    [
        (GOOD[:1], "list of 2 reports"),
        (tuple(GOOD), "list of 2 reports"),
        ([GOOD[0], {"defective": True, "kind": "spot"}], "keys"),
        ([GOOD[0], {**GOOD[1], "score": 1.0}], "keys"),
        ([GOOD[0], report("dent")], "kind one of"),
        ([GOOD[0], {**GOOD[1], "defective": 1}], "must be a bool"),
        ([GOOD[0], {**GOOD[1], "defective": False}], "whether kind is not clean"),
        ([{**GOOD[0], "defective": True}, GOOD[1]], "whether kind is not clean"),
        ([report("clean", [(0, 0, 1, 1)]), GOOD[1]], "clean frame has no regions"),
        ([GOOD[0], report("spot", [(0, 0, 2, 129)])], "regions must be"),
        ([GOOD[0], report("spot", [(-1, 0, 2, 2)])], "regions must be"),
        ([GOOD[0], report("spot", [(2, 0, 2, 2)])], "regions must be"),
        ([GOOD[0], report("spot", [(0, 3, 2, 1)])], "regions must be"),
        ([GOOD[0], report("spot", [(0, 0, 2.0, 2)])], "regions must be"),
        ([GOOD[0], report("spot", [(0, 0, 2)])], "regions must be"),
        ([GOOD[0], {**GOOD[1], "regions": ((0, 0, 1, 1),)}], "regions must be"),
        ([{**GOOD[0], "regions": np.zeros((0, 4))}, GOOD[1]], "regions must be"),
    ],
    ids=[
        "too_few", "not_a_list", "missing_key", "extra_key", "unknown_kind", "int_defective",
        "defective_but_clean_kind", "clean_but_defective", "clean_with_regions", "off_the_grid",
        "negative", "empty_rows", "empty_columns", "float_coordinate", "three_numbers",
        "regions_not_a_list", "clean_with_an_array",
    ],
)  # fmt: skip
def test_valid_reports_rejects_malformed_reports(reports, says):
    with pytest.raises(checks.CheckFailed, match=says):
        capstone.valid_reports(reports, 2)


def test_valid_reports_accepts_numpy_ints_tuples_and_the_whole_grid():
    boxes = [(np.int64(0), 0, 1, 1), [0, 0, capstone.HEAT, capstone.HEAT]]
    reports = [GOOD[0], {"defective": True, "kind": "crack", "regions": boxes}]
    assert capstone.valid_reports(reports, 2) is reports


def test_region_iou_by_hand():
    none = [report("clean"), report("spot")]
    assert capstone.region_iou(none, none) == 1.0
    a = [report("clean"), report("spot", [(0, 0, 4, 4)])]
    assert capstone.region_iou(a, none) == 0.0
    assert capstone.region_iou(a, [report("clean"), report("spot", [(4, 4, 8, 8)])]) == 0.0
    assert capstone.region_iou(a, [report("spot", [(0, 0, 4, 4)]), report("clean")]) == 0.0
    # 16 cells each, 4 shared: 4 / 28
    overlap = [report("clean"), report("spot", [(2, 2, 6, 6)])]
    assert capstone.region_iou(a, overlap) == pytest.approx(4 / 28)
    # overlapping boxes of one report count their cells once
    doubled = [report("clean"), report("spot", [(0, 0, 4, 4), (0, 0, 4, 4), (2, 2, 6, 6)])]
    assert capstone.region_iou(doubled, overlap) == pytest.approx(16 / 28)


# ---------------------------------------------------------------------------------------------
# F1 and its bootstrap


def test_f1_drop_is_zero_for_the_same_decisions():
    real = np.arange(40) % 2 == 0
    found = real.copy()
    found[:6] = ~found[:6]
    drop = capstone.f1_drop(found, found.copy(), real)
    assert drop.drop == 0 and (drop.low, drop.high) == (0.0, 0.0)
    assert drop.baseline == drop.line == pytest.approx(100 * 2 * 17 / (20 + 20))


def test_f1_drop_of_a_line_that_misses_defects_is_clearly_positive_and_seeded():
    real = np.arange(100) % 2 == 0
    line = real.copy()
    line[np.flatnonzero(real)[:20]] = False  # 20 of 50 defects missed: F1 75
    drop = capstone.f1_drop(real, line, real, seed=3)
    assert (drop.baseline, drop.line) == (100.0, pytest.approx(75.0))
    assert drop.drop == pytest.approx(25.0)
    assert 1 < drop.low < drop.drop < drop.high
    assert capstone.f1_drop(real, line, real, seed=3) == drop
    assert capstone.f1_drop(real, line, real, seed=4) != drop


# ---------------------------------------------------------------------------------------------
# Agreement with the reference line


def test_agreement_accepts_the_reference_lines_own_reports():
    agreement = capstone.Agreement()
    for number in (10, 11):
        args = agreement.add(lot(number, 16))
        assert args == (lot(number, 16).frames,)
        agreement(args, capstone.ReferenceLine(agreement.reference.model)(*args))
    assert sum(agreement.wrong["defective"]) == sum(agreement.wrong["kind"]) == 0


def test_agreement_fails_flipped_decisions_once_enough_frames_tell():
    agreement = capstone.Agreement()
    args = agreement.add(lot(10, 16))
    agreement(args, every_kind_flipped(agreement.reference(*args)))  # 16 frames cannot tell
    args = agreement.add(lot(11, 16))
    with pytest.raises(checks.CheckFailed, match="'kind' is wrong on"):
        agreement(args, every_kind_flipped(agreement.reference(*args)))


@pytest.mark.parametrize(
    "regions",
    [lambda r: [], lambda r: [[0, 0, capstone.HEAT, capstone.HEAT]]],
    ids=["emptied", "whole_grid"],
)
def test_agreement_fails_regions_unlike_the_references(regions):
    agreement = capstone.Agreement()
    args = agreement.add(lot(10, 16))
    wrong = [
        {**r, "regions": regions(r["regions"])} if r["defective"] else r
        for r in agreement.reference(*args)
    ]
    with pytest.raises(checks.CheckFailed, match="IoU"):
        agreement(args, wrong)


def test_agreement_fails_malformed_reports():
    agreement = capstone.Agreement()
    args = agreement.add(lot(10, 4))
    with pytest.raises(checks.CheckFailed, match="list of 4 reports"):
        agreement(args, [report("clean")] * 3)


# ---------------------------------------------------------------------------------------------
# The graders, in the notebook (no judge), at tiny sizes


@pytest.fixture
def graded(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv(checks.SEED_ENV, "1234")
    monkeypatch.setattr(capstone, "sizes", lambda: capstone.Sizes(4, 2, 1.0))


def test_check_breakdown_passes_the_reference_line(graded, capsys):
    assert capstone.check_breakdown(capstone.ReferenceLine(), points=2) == 2.0
    assert "2/2 points" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (ThreeStages, "time exactly decode, preprocess, model, post"),
        (UntimedWork, "add up to"),
        (FabricatedSeconds, "add up to"),
    ],
    ids=["three_stages", "untimed_work", "fabricated_seconds"],
)
def test_check_breakdown_fails_a_wrong_split(graded, line, says):
    with pytest.raises(checks.CheckFailed, match=says):
        capstone.check_breakdown(line(), points=2)


def test_check_lot_speed_scores_the_reference_line_and_not_the_baseline(graded):
    assert capstone.check_lot_speed(capstone.ReferenceLine(), points=4) > 0
    with pytest.raises(checks.CheckFailed, match="lot_speedup"):
        capstone.check_lot_speed(capstone.BaselineLine(), points=4)
    assert checks.RESULTS[-1].points == 0


def test_check_findings_full_points_for_the_baseline_and_none_for_all_clean(graded):
    assert capstone.check_findings(capstone.BaselineLine(), points=3) == 3.0
    with pytest.raises(checks.CheckFailed, match="IoU"):  # its missing regions give it away
        capstone.check_findings(all_clean, points=3)


def test_check_findings_scores_the_f1_drop_of_all_clean_zero(graded, monkeypatch):
    """With the agreement waived, the F1 grade alone fails a line that finds no defect."""
    monkeypatch.setattr(capstone.Agreement, "__call__", lambda self, args, reports: None)
    with pytest.raises(checks.CheckFailed, match="defect F1 on 8 held-out frames: yours 0.00"):
        capstone.check_findings(all_clean, points=3)
    result = checks.RESULTS[-1]
    assert result.points == 0 and result.value > result.floor


# ---------------------------------------------------------------------------------------------
# The detector's weights


def test_inspection_detector_loads_checked_weights_and_refuses_tampered_ones(tmp_path, monkeypatch):
    model = models.inspection_detector()
    assert not model.training
    data = bytearray(models.DETECTOR_WEIGHTS.read_bytes())
    data[len(data) // 2] ^= 1
    tampered = tmp_path / "inspection_detector.pt"
    tampered.write_bytes(bytes(data))
    monkeypatch.setattr(models, "DETECTOR_WEIGHTS", tampered)
    with pytest.raises(RuntimeError, match="sha256.*git checkout"):
        models.inspection_detector()
