"""The report card draws every check the same way round: right of the target line is better."""

import base64

from ptcourse.course import report
from ptcourse.course.execute import LabRun


def row(kind, value, target, floor, points=1.0):
    return {"check": kind, "kind": kind, "value": value, "ci_low": None, "ci_high": None,
            "target": target, "floor": floor, "points": points, "max_points": 1.0}  # fmt: skip


def test_a_small_error_and_a_large_speedup_both_sit_right_of_the_target():
    error = row("relative_error", 0.0002, 0.1, 0.3)  # Lab 00's rows drew as 500x before
    assert 1.0 < report._position(error, error["value"]) < 2.0
    assert report._position(error, 0.3) == 0.0 and report._position(error, 0.5) < 0
    speed = row("speedup", 3.0, 2.0, 1.2)
    assert report._position(speed, 2.0) == 1.0 and report._position(speed, 3.0) > 1.0


def test_the_page_holds_a_plot_and_every_check(tmp_path):
    rows = [row("relative_error", 0.0002, 0.1, 0.3), row("speedup", 50, 2, 1.2, 0.5)]
    run = LabRun("00-measuring-right", "measuring right", "cpu", "test", "cpu", True, 1.0, "",
                 results=rows)  # fmt: skip
    _, page = report.write([run], tmp_path, smoke=True)
    text = page.read_text()
    assert "relative_error" in text and "speedup" in text
    png = text.split("data:image/png;base64,")[1].split('"')[0]
    assert base64.b64decode(png).startswith(b"\x89PNG")


def test_the_page_names_the_machine_its_ceilings_and_the_claim_each_lab_tests(tmp_path):
    from ptcourse.core.measure import Ceilings

    run = LabRun("06-attention", "attention", "cpu", "test", "cpu", True, 1.0, "",
                 results=[row("speedup", 3.0, 2.0, 1.2)])  # fmt: skip
    ceilings = Ceilings(1e11, 2e11, 3e10, 1, "cpu")
    _, page = report.write([run], tmp_path, smoke=True, ceilings=ceilings)
    text = page.read_text()
    assert "Flash Attention: 1.8x faster" in text and "Measured here: speedup 3" in text
    assert "matmul fp32 100.0 GFLOP/s" in text and "torch " in text


def test_roofline_points_are_shown_as_a_share_of_the_bound_that_applies_here(tmp_path):
    from ptcourse.core.measure import Ceilings

    ceilings = Ceilings(1e11, 2e11, 1e10, 1, "cpu")  # ridge 10 FLOP/byte
    points = [{"workload": "matmul 512²", "intensity": 85.0, "flops_per_s": 8e10},
              {"workload": "add", "intensity": 0.083, "flops_per_s": 4e8}]  # fmt: skip
    run = LabRun("00-measuring-right", "measuring right", "cpu", "test", "cpu", True, 1.0, "",
                 attained=points)  # fmt: skip
    _, page = report.write([run], tmp_path, smoke=True, ceilings=ceilings)
    text = page.read_text()
    assert "compute (fp32 matmul peak)</td><td>80%" in text  # 80 of 100 GFLOP/s
    assert "memory (copy bandwidth)</td><td>48%" in text  # 0.4 of 10 GB/s x 0.083


def test_attained_points_reach_the_run_only_through_its_file(tmp_path, monkeypatch):
    from ptcourse.core import attained

    monkeypatch.delenv(attained.ENV, raising=False)
    attained.record({"x": (1.0, 2.0)})  # outside `ptcourse run`: nothing written, no error
    monkeypatch.setenv(attained.ENV, str(tmp_path / "a.jsonl"))
    attained.record({"x": (1.0, 2.0)})
    assert attained.read(tmp_path / "a.jsonl") == [
        {"workload": "x", "intensity": 1.0, "flops_per_s": 2.0}
    ]
    assert attained.read(tmp_path / "missing.jsonl") == []
