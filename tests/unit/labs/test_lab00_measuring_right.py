"""Unit tests of ptcourse.labs.lab00_measuring_right: the simulated device (well under ten
seconds) and the four graders on a right, a wrong and a baseline-equivalent answer (smoke size,
fixed secret seed; about half a minute, the timer checks time real references)."""

from __future__ import annotations

import statistics
import time

import pytest

from ptcourse.core import measure
from ptcourse.grading.checks import CheckFailed
from ptcourse.labs import lab00_measuring_right as ad


def test_launch_returns_at_once_and_synchronize_waits() -> None:
    with ad.SimulatedDevice() as dev:
        start = time.perf_counter()
        dev.launch(ad.kernel(0.05))
        launched = time.perf_counter() - start
        assert dev.pending == 1
        dev.synchronize()
        done = time.perf_counter() - start
    assert launched < 0.01
    assert done >= 0.05
    assert dev.pending == 0


def test_kernels_queue_up_back_to_back() -> None:
    with ad.SimulatedDevice() as dev:
        start = time.perf_counter()
        for _ in range(3):
            dev.launch(ad.kernel(0.05))
        assert dev.pending == 3
        dev.synchronize()
        assert time.perf_counter() - start >= 0.15


def test_events_time_the_device_not_the_host() -> None:
    with ad.SimulatedDevice() as dev:
        begin = dev.record()
        dev.launch(ad.kernel(0.03))
        dev.launch(ad.kernel(0.01))
        end = dev.record()
        assert not end.query()
        with pytest.raises(RuntimeError):
            begin.elapsed_time(end)
        end.synchronize()
        assert end.query()
        assert begin.elapsed_time(end) == pytest.approx(40.0, abs=2.0)


def test_callables_run_in_order_after_kernels() -> None:
    ran: list[float] = []
    with ad.SimulatedDevice() as dev:
        start = time.perf_counter()
        dev.launch(ad.kernel(0.03))
        dev.launch(lambda: ran.append(time.perf_counter() - start))
        dev.launch(ad.kernel(0.02))  # queued behind the callable
        end = dev.record()
        dev.synchronize()
        total = time.perf_counter() - start
        assert end.query()
    assert len(ran) == 1 and ran[0] >= 0.03
    assert total >= 0.05


def test_errors_surface_at_synchronize_and_skip_later_work() -> None:
    ran: list[int] = []
    with ad.SimulatedDevice() as dev:
        dev.launch(lambda: 1 / 0)  # returns normally: the error is not raised here
        dev.launch(lambda: ran.append(1))
        with pytest.raises(RuntimeError, match="ZeroDivisionError"):
            dev.synchronize()
        dev.synchronize()  # reported once
        dev.launch(lambda: ran.append(2))
        dev.synchronize()
    assert ran == [2]


def test_close_is_idempotent_and_final() -> None:
    dev = ad.SimulatedDevice("x")
    dev.launch(ad.kernel(0.001))
    dev.close()
    dev.close()
    assert "closed" in repr(dev)
    with pytest.raises(RuntimeError):
        dev.launch(ad.kernel(0.001))


def test_kernel_rejects_negative_and_runs_synchronously() -> None:
    with pytest.raises(ValueError):
        ad.kernel(-1)
    start = time.perf_counter()
    ad.kernel(0.01)()
    assert time.perf_counter() - start >= 0.01


def test_warming_is_slow_for_its_first_calls_only() -> None:
    work = ad.warming(0.08, 0.002, slow_calls=2)
    times = []
    for _ in range(6):
        start = time.perf_counter()
        work()
        times.append(time.perf_counter() - start)
    assert min(times[:2]) >= 0.08
    assert sorted(times[2:])[1] < 0.05  # robust to one call delayed by a busy machine


@pytest.mark.whole_machine
def test_busy_cores_start_and_stop() -> None:
    with measure.busy_cores(1, max_seconds=10) as procs:
        assert len(procs) == 1 and procs[0].poll() is None
    assert procs[0].poll() is not None
    assert 1 <= ad.neighbours_for_contention() <= 15


def _good_timer(fn, *, sync=lambda: None, warmup=3, repeats=20):
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def test_timer_error_separates_a_good_timer_from_a_naive_one(capsys) -> None:
    dev = ad.SimulatedDevice()

    def workload():
        return (lambda: dev.launch(ad.kernel(0.01))), dev.synchronize

    with dev:
        good = ad.timer_error(_good_timer, workload, repeats=5, min_run_time=0.05)
        naive = ad.timer_error(ad.baseline_time_it, workload, repeats=5, min_run_time=0.05)
    assert good.error < 0.3
    assert naive.error > 0.9
    assert "relative error" in capsys.readouterr().out


def _timer_in_ms(fn, *, sync=lambda: None, warmup=3, repeats=20):
    return 1e3 * _good_timer(fn, sync=sync, warmup=warmup, repeats=repeats)


def _timer_without_warmup(fn, *, sync=lambda: None, warmup=3, repeats=20):
    return _good_timer(fn, sync=sync, warmup=0, repeats=repeats)


def _timer_without_sync(fn, *, sync=lambda: None, warmup=3, repeats=20):
    return _good_timer(fn, warmup=warmup, repeats=repeats)


@pytest.fixture
def graded(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", "1234")
    monkeypatch.delenv("PTCOURSE_RESULTS", raising=False)
    monkeypatch.delenv("PTCOURSE_TRACK", raising=False)


def test_sizes_follow_smoke_mode_and_track(monkeypatch) -> None:
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = ad.sizes("cpu")
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = ad.sizes("cpu")
    assert smoke.samples < full.samples and smoke.reference_run_s < full.reference_run_s
    assert ad.sizes("cuda").roof_n > full.roof_n
    assert "roofline matmul" in str(full)


def test_compute_check_full_marks_for_a_right_timer(graded) -> None:
    assert ad.check_time_it_compute(_good_timer, points=2) == 2


def test_compute_check_fails_a_timer_in_milliseconds(graded) -> None:
    with pytest.raises(CheckFailed, match="time_it_compute"):
        ad.check_time_it_compute(_timer_in_ms, points=2)


def test_compute_check_may_pass_the_naive_timer(graded) -> None:
    # one call of a CPU matmul is about its median: the naive timer is not meant to fail here
    try:
        earned = ad.check_time_it_compute(ad.baseline_time_it, points=2)
    except CheckFailed:
        earned = 0.0
    assert 0 <= earned <= 2


def test_warmup_check_full_marks_for_a_right_timer(graded) -> None:
    assert ad.check_time_it_warmup(_good_timer, points=2) == 2


@pytest.mark.parametrize("timer", [ad.baseline_time_it, _timer_without_warmup])
def test_warmup_check_fails_timers_that_time_the_first_calls(graded, timer) -> None:
    with pytest.raises(CheckFailed, match="time_it_warmup"):
        ad.check_time_it_warmup(timer, points=2)


def test_async_check_full_marks_for_a_right_timer(graded) -> None:
    assert ad.check_time_it_async(_good_timer, points=2) == 2


@pytest.mark.parametrize("timer", [ad.baseline_time_it, _timer_without_sync])
def test_async_check_fails_timers_that_time_the_launch(graded, timer) -> None:
    with pytest.raises(CheckFailed, match="time_it_async"):
        ad.check_time_it_async(timer, points=2)


def _matmul_intensity(n, itemsize=4):
    return 2 * n**3 / (3 * n * n * itemsize)


def _add_intensity(n, itemsize=4):
    return n / (3 * n * itemsize)


def _bound(intensity, ceilings):
    return "compute" if intensity >= ceilings.fp32_flops / ceilings.copy_bytes_per_s else "memory"


def _unanswered(*args, **kwargs):
    raise NotImplementedError


def test_roofline_check_full_marks_for_right_answers(graded, capsys) -> None:
    assert ad.check_roofline(_matmul_intensity, _add_intensity, _bound, points=2) == 2
    assert "10 of 10 roofline answers correct" in capsys.readouterr().out


def test_roofline_check_gives_partial_credit(graded) -> None:
    def matmul_bytes_twice(n, itemsize=4):  # counts the output twice: 3 of 10 answers wrong
        return 2 * n**3 / (4 * n * n * itemsize)

    earned = ad.check_roofline(matmul_bytes_twice, _add_intensity, _bound, points=2)
    assert earned == pytest.approx(1.4)


def test_roofline_check_fails_an_unanswered_lab(graded) -> None:
    with pytest.raises(CheckFailed, match="roofline"):
        ad.check_roofline(_unanswered, _unanswered, _unanswered, points=2)


def test_the_quick_test_never_passes_what_a_hidden_check_fails(graded, capsys) -> None:
    """The visible test of Exercise 1 runs the hidden checks' comparison on public sizes: a right
    timer is below every floor, and each wrong one reaches the floor of the check it would fail."""
    right = ad.quick_timer_errors(_good_timer)
    assert all(error < floor for error, floor in right.values())
    assert "the hidden check asks relative_error ≤ 0.3" in capsys.readouterr().out
    for wrong, fails in (
        (_timer_in_ms, "time_it_compute"),
        (_timer_without_warmup, "time_it_warmup"),
        (_timer_without_sync, "time_it_async"),
        (ad.baseline_time_it, "time_it_async"),
    ):
        error, floor = ad.quick_timer_errors(wrong, only=(fails,))[fails]
        assert error >= floor, (wrong.__name__, fails, error)
