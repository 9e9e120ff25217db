import os
import sys
import warnings

import pytest
import torch

from ptcourse import grade, targets
from ptcourse.targets import Target

ROW = Target("00", "unit_speedup", "cpu", "speedup", 1.5, 1.3, "2.0x", "1.0x", "test", "today")
X = torch.randn(192, 192)


@pytest.fixture
def unit_target(monkeypatch):
    monkeypatch.setattr(targets, "TARGETS", (*targets.TARGETS, ROW))


def work(count):
    def run():
        for _ in range(count):
            X @ X

    return run


def test_failing_speedup_names_value_interval_target(unit_target, capsys):
    with pytest.raises(grade.CheckFailed) as failure:
        grade.check_speedup("00", "unit_speedup", work(2), work(2), points=2)
    message = str(failure.value)
    assert "speedup" in message and "95% CI" in message and "target ≥ 1.5" in message
    assert "track cpu" in message


def test_passing_speedup_returns_full_points(unit_target):
    assert grade.check_speedup("00", "unit_speedup", work(4), work(2), points=2) == 2


def test_partial_credit_between_floor_and_target(unit_target):
    earned = grade.check_value("00", "unit_speedup", lambda: 1.4, points=2)
    assert earned == pytest.approx(1.0)


def test_lower_is_better_kind(monkeypatch):
    row = Target("00", "err", "cpu", "relative_error", 0.2, 0.6, "0.05", "0.9", "test", "today")
    monkeypatch.setattr(targets, "TARGETS", (row,))
    assert grade.check_value("00", "err", lambda: 0.1) == 1.0
    assert grade.check_value("00", "err", lambda: 0.4) == pytest.approx(0.5)
    with pytest.raises(grade.CheckFailed):
        grade.check_value("00", "err", lambda: 0.7)


def test_checks_never_write_to_stderr(unit_target, capfd):
    def noisy():
        warnings.warn("deprecated thing", FutureWarning, stacklevel=2)
        print("progress bar", file=sys.stderr)
        os.write(2, b"C-level line\n")
        return 1.4

    grade.check_value("00", "unit_speedup", noisy)
    out, err = capfd.readouterr()
    assert err == ""
    assert "deprecated thing" in out and "C-level line" in out


def test_results_are_recorded_for_the_report_card(unit_target, tmp_path, monkeypatch):
    path = tmp_path / "results.jsonl"
    monkeypatch.setenv(grade.RESULTS_ENV, str(path))
    grade.check_value("00", "unit_speedup", lambda: 1.6)
    assert '"check": "unit_speedup"' in path.read_text()


def test_fresh_undoes_redefinitions():
    grade.check_speedup = lambda *args, **kwargs: 100.0
    fresh = grade.fresh()
    assert fresh.check_speedup.__name__ == "check_speedup"


def test_check_close_messages():
    grade.check_close(torch.ones(3), torch.ones(3), atol=0, rtol=0)
    with pytest.raises(grade.CheckFailed, match="shape"):
        grade.check_close(torch.ones(2), torch.ones(3), atol=0, rtol=0)
    with pytest.raises(grade.CheckFailed, match="max abs difference"):
        grade.check_close(torch.ones(3), torch.zeros(3), atol=1e-3, rtol=0)


def test_secret_seed_respects_environment(monkeypatch):
    monkeypatch.setenv(grade.SEED_ENV, "1234")
    assert grade.secret_seed() == 1234


def test_track_without_own_row_uses_cpu_twin(unit_target):
    assert targets.target("00", "unit_speedup", "cuda") is ROW


def test_importing_and_reloading_graders_is_silent():
    """A hidden test cell's first lines must not write to stderr (nbgrader would score 0)."""
    import subprocess

    code = (
        "import ptcourse.grade as g; g = g.fresh(); "
        "g.measure.time_callable(lambda: None, min_run_time=0.05)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr
