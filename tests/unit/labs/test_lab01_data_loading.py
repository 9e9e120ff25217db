"""Lab 01's checks: the notebook's solution earns full points, wrong answers fail, and copies of
the baseline earn nothing on the speed check (smoke sizes, fixed secret seed)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ptcourse.assets import datasets, loaders
from ptcourse.core import measure
from ptcourse.grading.checks import CheckFailed
from ptcourse.labs import lab01_data_loading as lab01

NOTEBOOK = Path(__file__).resolve().parents[3] / "solutions/01-data-loading/01-data-loading.ipynb"
EXERCISES = ("build_cache", "augment_batch", "cached_batches", "wait_and_compute")


@pytest.fixture(autouse=True)
def smoke_seed_one_thread(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", "20261203")
    with measure.pinned_threads(1):
        yield


@pytest.fixture(scope="module")
def solution() -> SimpleNamespace:
    """The notebook's answers, run from its solution cells."""
    namespace = {"torch": torch, "F": F, "loaders": loaders, "time": time}
    for cell in json.loads(NOTEBOOK.read_text())["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") in EXERCISES:
            exec("".join(cell["source"]), namespace)
    return SimpleNamespace(**{name: namespace[name] for name in EXERCISES})


# What tests/integration/submissions/lab01.py hands in as the baseline-equivalent submission.
def per_sample_augment(images, generator, spec=loaders.SPEC):
    transform = loaders.baseline_transform(spec)
    return torch.stack([transform(image) for image in images])


def baseline_batches(images, labels, batch_size, generator, device="cpu"):
    files = datasets.inspection_splits(smoke=True)[0][:64]  # the speed check pulls one batch
    yield from loaders.baseline_loader(files, batch_size)


def test_sizes_shrink_in_smoke_mode(monkeypatch):
    smoke = lab01.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = lab01.sizes()
    assert (smoke.batch, smoke.timed_batches) == (32, 1)
    assert (full.batch, full.timed_batches) == (64, 2)
    assert smoke.epoch_images == full.epoch_images == 77


# -- check_cache ---------------------------------------------------------------------------------


def test_cache_check_passes_the_solution_and_a_stacked_cache(solution):
    def stacked(files):
        images = torch.stack([loaders.decode(path) for path, _ in files])
        return images, torch.tensor([label for _, label in files])

    assert lab01.check_cache(solution.build_cache, points=1) == 1.0
    assert lab01.check_cache(stacked, points=1) == 1.0


@pytest.mark.parametrize(
    "wrong,message",
    [
        (lambda cache: (cache[0].float(), cache[1]), "uint8"),
        (lambda cache: (cache[0], cache[1].flip(0)), "aligned"),
        (lambda cache: (cache[0][:, :, :128], cache[1]), "shape"),
        (lambda cache: (cache[0].flip(-1), cache[1]), "PIL"),
    ],
)
def test_cache_check_fails_wrong_caches(solution, wrong, message):
    with pytest.raises(CheckFailed, match=message):
        lab01.check_cache(lambda files: wrong(solution.build_cache(files)), points=1)


def test_cache_check_ignores_a_patched_decoder(monkeypatch):
    black = torch.zeros(3, 256, 256, dtype=torch.uint8)
    monkeypatch.setattr(loaders, "decode", lambda path: black)

    def black_cache(files):
        return black.expand(len(files), 3, 256, 256), torch.tensor([y for _, y in files])

    with pytest.raises(CheckFailed, match="PIL"):  # compared with the real decoder, not the patch
        lab01.check_cache(black_cache, points=1)


# -- check_augment -------------------------------------------------------------------------------


def test_augment_check_passes_the_solution_and_the_per_sample_transform(solution):
    assert lab01.check_augment(solution.augment_batch, points=3) == 3.0
    assert lab01.check_augment(per_sample_augment, points=3) == 3.0


def test_augment_check_fails_missing_flips_and_missing_colour_jitter(solution):
    def never_flips(images, generator, spec=loaders.SPEC):
        return solution.augment_batch(images, generator, dataclasses.replace(spec, flip_p=0.0))

    def no_jitter(images, generator, spec=loaders.SPEC):
        plain = dataclasses.replace(spec, brightness=0.0, contrast=0.0)
        return solution.augment_batch(images, generator, plain)

    def one_crop(images, generator, spec=loaders.SPEC):
        same = torch.Generator().manual_seed(0)
        return torch.cat(
            [solution.augment_batch(x[None], same.manual_seed(0), spec) for x in images]
        )

    with pytest.raises(CheckFailed, match="flipped"):
        lab01.check_augment(never_flips, points=3)
    with pytest.raises(CheckFailed, match="brightness factors"):
        lab01.check_augment(no_jitter, points=3)
    with pytest.raises(CheckFailed, match="crop sizes"):
        lab01.check_augment(one_crop, points=3)


# -- check_batches -------------------------------------------------------------------------------


def test_batches_check_passes_the_solution(solution):
    assert lab01.check_batches(solution.cached_batches, points=2) == 2.0


def test_batches_check_fails_misaligned_labels_repeated_epochs_and_the_baseline(solution):
    augment = solution.augment_batch

    def misaligned(images, labels, batch_size, generator, device="cpu"):
        order = torch.randperm(len(images), generator=generator)
        for start in range(0, len(images), batch_size):
            index = order[start : start + batch_size]
            yield augment(images[index], generator), labels[start : start + batch_size]

    def same_every_epoch(images, labels, batch_size, generator, device="cpu"):
        yield from solution.cached_batches(
            images, labels, batch_size, torch.Generator().manual_seed(0)
        )

    with pytest.raises(CheckFailed, match="aligned"):
        lab01.check_batches(misaligned, points=2)
    with pytest.raises(CheckFailed, match="identical"):
        lab01.check_batches(same_every_epoch, points=2)
    with pytest.raises(CheckFailed, match="batch sizes"):
        lab01.check_batches(baseline_batches, points=2)


# -- check_speed ---------------------------------------------------------------------------------


def test_speed_check_gives_the_solution_full_points(solution):
    assert lab01.check_speed(solution.build_cache, solution.cached_batches, points=4) == 4.0


def test_speed_check_gives_the_baseline_loader_nothing(solution):
    with pytest.raises(CheckFailed, match="0/4 points"):
        lab01.check_speed(solution.build_cache, baseline_batches, points=4)


def test_speed_check_wants_the_whole_cache(solution):
    def partial(files):
        return solution.build_cache(files[:10])

    with pytest.raises(CheckFailed, match="full uint8 set"):
        lab01.check_speed(partial, solution.cached_batches, points=4)


def test_the_reference_is_the_notebooks_answer(solution):
    files = datasets.inspection_splits(smoke=True)[0][:20]
    built, want = lab01.reference_build_cache(files), solution.build_cache(files)
    assert all(torch.equal(a, b) for a, b in zip(built, want, strict=True))
    images, labels = built
    ours = list(lab01.reference_cached_batches(images, labels, 8, torch.Generator().manual_seed(3)))
    theirs = list(solution.cached_batches(images, labels, 8, torch.Generator().manual_seed(3)))
    assert len(ours) == len(theirs) == 3
    for (x, y), (want_x, want_y) in zip(ours, theirs, strict=True):
        assert torch.equal(x, want_x) and torch.equal(y, want_y)


def test_a_timed_call_that_replays_its_batches_fails(solution):
    images, labels = lab01.reference_build_cache(datasets.inspection_splits(smoke=True)[0][:64])
    size = lab01.sizes()
    verify = lab01.timed_batches_check(size)

    def epoch(seed):
        cache = (images, labels)
        return lab01.pull_batches(solution.cached_batches, cache, size.batch, seed, 1, "cpu")

    first = epoch(1)
    verify((), first)
    verify((), epoch(2))
    with pytest.raises(CheckFailed, match="repeated images"):
        verify((), first)
    with pytest.raises(CheckFailed, match="batch"):
        verify((), [])
    x, y = first[0]
    with pytest.raises(CheckFailed, match="normalised range"):
        verify((), [(x * 100, y)])


def test_pulling_batches_from_the_cache_opens_no_file(solution):
    images, labels = lab01.reference_build_cache(datasets.inspection_splits(smoke=True)[0][:64])
    args = ((images, labels), 32, 0, 1, "cpu")
    assert lab01.files_opened(solution.cached_batches, *args) == 0
    assert lab01.files_opened(baseline_batches, *args) >= 32


def test_where_speed_is_not_gradable_a_pipeline_that_opens_no_file_earns_the_points(
    solution, monkeypatch, capsys
):
    out_of_reach = dataclasses.replace(lab01.TARGETS[0], target=1000.0, floor=900.0)
    monkeypatch.setattr(lab01, "TARGETS", (out_of_reach,))
    assert lab01.check_speed(solution.build_cache, solution.cached_batches, points=4) == 4.0
    assert "not gradable" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="opened"):
        lab01.check_speed(solution.build_cache, baseline_batches, points=4)


# Exercise D: the wait/compute split of a loop whose waits and step times are known sleeps.


def lumped(batches, step, steps):
    """Baseline-equivalent: one clock around the whole iteration, reported as compute."""
    waits, computes = [], []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(batches)
        step(x, y)
        waits.append(0.0)
        computes.append(time.perf_counter() - start)
    return waits, computes


def clock_not_reset(batches, step, steps):
    """The wait read after the step: waits include the compute."""
    waits, computes = [], []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(batches)
        mid = time.perf_counter()
        step(x, y)
        waits.append(time.perf_counter() - start)
        computes.append(time.perf_counter() - mid)
    return waits, computes


def in_milliseconds(batches, step, steps):
    waits, computes = [], []
    for _ in range(steps):
        start = time.perf_counter()
        x, y = next(batches)
        mid = time.perf_counter()
        step(x, y)
        waits.append(1e3 * (mid - start))
        computes.append(1e3 * (time.perf_counter() - mid))
    return waits, computes


def reads_the_answer(batches, step, steps):
    """A cheat that skips the work and returns made-up constants."""
    return [0.025] * steps, [0.02] * steps


def too_few(batches, step, steps):
    waits, computes = [], []
    for _ in range(steps - 1):
        start = time.perf_counter()
        x, y = next(batches)
        mid = time.perf_counter()
        step(x, y)
        waits.append(mid - start)
        computes.append(time.perf_counter() - mid)
    return waits, computes


def test_loop_timing_check_gives_the_solution_full_points(solution):
    assert lab01.check_loop_timing(solution.wait_and_compute, points=1) == 1


@pytest.mark.parametrize(
    "wrong",
    [lumped, clock_not_reset, in_milliseconds, reads_the_answer, too_few],
    ids=lambda f: f.__name__,
)
def test_loop_timing_check_fails_wrong_splits_and_the_baseline(wrong):
    with pytest.raises(CheckFailed):
        lab01.check_loop_timing(wrong, points=1)


def test_loop_split_skips_the_start_up_and_shares_add_up(solution):
    size = dataclasses.replace(lab01.sizes(), loop_steps=3, loop_skip=1)
    split = lab01.loop_split(
        solution.wait_and_compute,
        lab01.SleepyBatches([0.05, 0.03, 0.03, 0.03]),
        lab01.SleepyStep([0.02]),
        size,
    )
    assert len(split.wait_s) == len(split.compute_s) == 3
    assert split.startup_s >= 0.05
    assert 0.5 < split.wait_share < 0.7
    verdict = lab01.loop_verdicts({"a": split, "b": split}, [("a", "b")])
    assert "did not help" in verdict and "data-bound" in verdict


def test_a_training_step_trains():
    step = lab01.training_step(4)
    x, y = torch.randn(8, 3, 32, 32), torch.randint(0, 4, (8,))
    step(x, y)  # runs forward, backward and an update without error
