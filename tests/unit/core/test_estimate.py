"""A full-size run's time, estimated from a short probe against the measured reference."""

import pytest

from ptcourse.core import estimate, smoke


def test_every_lab_has_a_measured_full_size():
    assert set(estimate.FULL_SIZE_S) == {f"{n:02d}" for n in range(14)}
    assert estimate.PROBE_S > 0


def test_the_estimate_scales_with_the_probe():
    twice_as_slow = estimate.full_size_seconds("05", probe=2 * estimate.PROBE_S)
    assert twice_as_slow == pytest.approx(2 * estimate.FULL_SIZE_S["05"])
    assert estimate.full_size_seconds("99", probe=estimate.PROBE_S) is None


def test_the_probe_is_short_and_positive():
    assert 0 < estimate.probe_seconds(repeats=3) < 1.0


def test_a_full_size_notebook_says_how_long_it_will_take(capsys, monkeypatch):
    monkeypatch.setenv(smoke.ENV_VAR, "1")
    smoke.set_smoke(False, lab="13")
    line = capsys.readouterr().out
    assert line.startswith("Full size: about ") and "on this machine" in line
    smoke.set_smoke(True, lab="13")
    assert capsys.readouterr().out == ""


def test_a_full_run_plan_adds_up_the_labs(monkeypatch):
    monkeypatch.setattr(estimate, "probe_seconds", lambda: estimate.PROBE_S)
    plan = estimate.run_plan(["00", "04"], lanes=1)
    total = estimate.FULL_SIZE_S["00"] + estimate.FULL_SIZE_S["04"]
    assert f"about {total:.0f} s in 1 lane(s)" in plan
    assert plan.count("\n  lab ") == 2
