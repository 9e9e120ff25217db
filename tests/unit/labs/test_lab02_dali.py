"""ptcourse.labs.lab02_dali: the torchvision reference, the checks, the DALI and no-DALI paths."""

import pytest
import torch
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2

from ptcourse.assets import datasets
from ptcourse.core import hardware, measure
from ptcourse.grading import checks
from ptcourse.labs import lab02_dali as dali_pipeline


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


@pytest.fixture(scope="module")
def files():
    train, _ = datasets.inspection_splits(smoke=True)
    return train[::9][:24]  # every class, 24 images


def _tvio_batch(paths, size=dali_pipeline.SPEC.size):
    """The lab's exercise A, for testing the helpers."""
    images = torch.stack(decode_jpeg([read_file(str(path)) for path in paths]))
    images = v2.functional.resize(images, [size, size], antialias=True).float() / 255
    mean = torch.tensor(dali_pipeline.SPEC.mean).view(1, 3, 1, 1)
    std = torch.tensor(dali_pipeline.SPEC.std).view(1, 3, 1, 1)
    return (images - mean) / std


def _unnormalised(paths):
    return _tvio_batch(paths) * torch.tensor(dali_pipeline.SPEC.std).view(1, 3, 1, 1)


def test_track_is_cpu_with_dali_and_cpu_basic_without(monkeypatch):
    monkeypatch.delenv("PTCOURSE_TRACK", raising=False)
    monkeypatch.setattr(hardware, "_cuda", lambda: hardware.Cuda(False))
    missing = hardware.Backend(
        "dali", False, detail="ModuleNotFoundError: No module named 'nvidia'"
    )
    monkeypatch.setattr(hardware, "backend", lambda name: missing)
    track = hardware.track_for("02")
    assert track.name == "cpu-basic"
    assert "dali" in track.reason and "cuda" in track.reason
    present = hardware.Backend("dali", True, "2.4.0")
    monkeypatch.setattr(hardware, "backend", lambda name: present)
    assert hardware.track_for("02").name == "cpu"


def test_without_dali_the_pipeline_explains_itself(monkeypatch):
    missing = hardware.Backend(
        "dali", False, detail="ModuleNotFoundError: No module named 'nvidia'"
    )
    monkeypatch.setattr(hardware, "backend", lambda name: missing)
    assert not dali_pipeline.available()
    with pytest.raises(ImportError, match="Linux wheels"):
        dali_pipeline.dali()

    @dali_pipeline.missing_pipeline_def
    def graph(paths, labels):
        """a graph"""

    assert graph.__name__ == "graph" and graph.__doc__ == "a graph"
    with pytest.raises(ImportError, match="torchvision.io pipeline instead"):
        graph([], [], batch_size=2)


def test_cpu_basic_grades_the_torchvision_io_pipeline(files, monkeypatch):
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu-basic")
    assert hardware.track_for("02").name == "cpu-basic"

    def correct():
        return float(dali_pipeline.equivalent(dali_pipeline.alignment(loader(_tvio_batch), files)))

    def loader(batch_fn):
        return dali_pipeline.batched_loader(files, 10, batch_fn, generator=torch.Generator())

    assert checks.check_value("02", "tvio_equivalence", correct, points=4) == 4
    wrong = dali_pipeline.alignment(loader(_unnormalised), files)
    assert not dali_pipeline.equivalent(wrong)
    with pytest.raises(checks.CheckFailed):
        checks.check_value(
            "02", "tvio_equivalence", lambda: float(dali_pipeline.equivalent(wrong)), points=4
        )


def test_alignment_sees_order_labels_and_values(files):
    paths = [path for path, _ in files]
    reference = dali_pipeline.reference_batch(paths)
    labels = torch.tensor([label for _, label in files])
    good = dali_pipeline.alignment(
        [(reference[:16], labels[:16]), (reference[16:], labels[16:])], files
    )
    assert dali_pipeline.equivalent(good) and good.batch_sizes == (16, 8)
    rolled = dali_pipeline.alignment([(reference, labels.roll(1))], files)
    assert rolled.label_errors > 0 and not dali_pipeline.equivalent(rolled)
    twice = dali_pipeline.alignment([(reference[:12], labels[:12])] * 2, files)
    assert not twice.each_once
    with pytest.raises(AssertionError, match="int64"):
        dali_pipeline.check_batch_format(reference, labels.int(), 128)
    with pytest.raises(AssertionError, match="NCHW"):
        dali_pipeline.check_batch_format(reference.permute(0, 2, 3, 1), labels, 128)


needs_dali = pytest.mark.skipif(not dali_pipeline.available(), reason="NVIDIA DALI not installed")


def _graph():
    """A correct inference pipeline (the lab's exercise B with train=False)."""
    from nvidia.dali import fn, pipeline_def, types

    spec = dali_pipeline.SPEC

    @pipeline_def
    def graph(paths, labels, size, train, shuffle, gpu):
        jpegs, label = fn.readers.file(
            files=paths, labels=labels, random_shuffle=shuffle, name="reader"
        )
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        images = fn.resize(images, size=[size, size])
        images = fn.crop_mirror_normalize(
            images,
            dtype=types.FLOAT,
            output_layout="CHW",
            mean=[255 * m for m in spec.mean],
            std=[255 * s for s in spec.std],
        )
        return images, label

    return graph


@needs_dali
def test_dali_sync_pipeline_matches_the_reference_quietly(files):
    from ptcourse.core.quiet import captured_stderr

    with captured_stderr() as said:
        pipe = dali_pipeline.sync_pipeline(_graph(), files, 8, train=False, shuffle=False)
        batches = [dali_pipeline.run_batch(pipe) for _ in range(3)]
    for x, y in batches:
        dali_pipeline.check_batch_format(x, y, 128)
    check = dali_pipeline.alignment(batches, files)
    assert dali_pipeline.equivalent(check), check.summary()
    assert torch.cat([y for _, y in batches]).tolist() == [label for _, label in files]
    assert not said.text.strip(), said.text


@needs_dali
def test_repeated_dali_builds_do_not_leak_threads(files):
    graph = _graph()
    dali_pipeline.run_batch(dali_pipeline.sync_pipeline(graph, files, 8))  # first build loads DALI
    before = dali_pipeline.os_threads()
    for seed in range(5):
        pipe = dali_pipeline.sync_pipeline(graph, files, 8, seed=seed)
        dali_pipeline.run_batch(pipe)
        del pipe
    assert dali_pipeline.os_threads() <= before + 1
