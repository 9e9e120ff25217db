"""ptcourse.labs.lab02_dali: the torchvision reference, the helpers, the DALI and no-DALI paths,
and both graders on a right, a wrong and a baseline-equivalent answer (smoke size, fixed secret
seed; the DALI speed check times real pipelines for a few seconds each)."""

import dataclasses

import pytest
import torch
from torchvision.io import decode_jpeg, read_file
from torchvision.transforms import v2

from ptcourse.assets import datasets, loaders
from ptcourse.core import hardware, measure
from ptcourse.grading import checks
from ptcourse.labs import lab02_dali as dali_pipeline

SPEC = loaders.SPEC


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


@pytest.fixture(scope="module")
def files():
    train, _ = datasets.inspection_splits(smoke=True)
    return train[::9][:24]  # every class, 24 images


def _tvio_batch(paths, size=SPEC.size):
    """The lab's exercise A, for testing the helpers."""
    images = torch.stack(decode_jpeg([read_file(str(path)) for path in paths]))
    images = v2.functional.resize(images, [size, size], antialias=True).float() / 255
    mean = torch.tensor(SPEC.mean).view(1, 3, 1, 1)
    std = torch.tensor(SPEC.std).view(1, 3, 1, 1)
    return (images - mean) / std


def _unnormalised(paths):
    return _tvio_batch(paths) * torch.tensor(SPEC.std).view(1, 3, 1, 1)


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
    with pytest.raises(checks.CheckFailed, match="int64"):
        dali_pipeline.assert_batch_format(reference, labels.int(), 128)
    with pytest.raises(AssertionError, match="NCHW"):
        dali_pipeline.assert_batch_format(reference.permute(0, 2, 3, 1), labels, 128)


needs_dali = pytest.mark.skipif(not dali_pipeline.available(), reason="NVIDIA DALI not installed")


def _graph(augment=True, layout="CHW"):
    """The lab's exercise B (the solution); ``augment=False`` only resizes, even for training."""
    from nvidia.dali import fn, pipeline_def, types

    @pipeline_def
    def graph(paths, labels, size, train, shuffle, gpu):
        jpegs, label = fn.readers.file(
            files=paths, labels=labels, random_shuffle=shuffle, name="reader"
        )
        images = fn.decoders.image(jpegs, device="cpu", output_type=types.RGB)
        mirror = 0
        if train and augment:
            images = fn.random_resized_crop(
                images, size=[size, size], random_area=list(SPEC.scale),
                random_aspect_ratio=list(SPEC.ratio),
            )  # fmt: skip
            images = fn.brightness_contrast(
                images,
                brightness=fn.random.uniform(range=(1 - SPEC.brightness, 1 + SPEC.brightness)),
                contrast=fn.random.uniform(range=(1 - SPEC.contrast, 1 + SPEC.contrast)),
            )
            mirror = fn.random.coin_flip(probability=SPEC.flip_p)
        else:
            images = fn.resize(images, size=[size, size])
        images = fn.crop_mirror_normalize(
            images, dtype=types.FLOAT, output_layout=layout, mirror=mirror,
            mean=[255 * m for m in SPEC.mean], std=[255 * s for s in SPEC.std],
        )  # fmt: skip
        return images, label

    return graph


def _pil_in_dali():
    """The baseline-equivalent exercise B: Lab 01's per-sample PIL work inside DALI."""
    import io

    import numpy as np
    from nvidia.dali import fn, pipeline_def
    from PIL import Image

    @pipeline_def
    def graph(paths, labels, size, train, shuffle, gpu):
        jpegs, label = fn.readers.file(
            files=paths, labels=labels, random_shuffle=shuffle, name="reader"
        )
        transform = loaders.baseline_transform() if train else dali_pipeline.eval_transform()

        def pil(encoded):
            with Image.open(io.BytesIO(np.asarray(encoded).tobytes())) as image:
                return transform(image.convert("RGB")).numpy()

        return fn.python_function(jpegs, function=pil, batch_processing=False), label

    return graph


def _loader(graph):
    """The lab's exercise C (the solution) around ``graph``."""
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    def dali_loader(files, batch_size, size=SPEC.size, train=True, shuffle=True, seed=0,
                    device_id=None):  # fmt: skip
        paths = [str(path) for path, _ in files]
        labels = [int(label) for _, label in files]
        pipe = graph(
            paths, labels, size, train, shuffle, device_id is not None,
            batch_size=batch_size, num_threads=1, device_id=device_id, seed=seed,
        )  # fmt: skip
        pipe.build()
        batches = DALIGenericIterator(
            [pipe], ["x", "y"], reader_name="reader", last_batch_policy=LastBatchPolicy.PARTIAL
        )
        for out in batches:
            yield out[0]["x"], out[0]["y"].reshape(-1).long()

    return dali_loader


def _pil_loader(files, batch_size, size=SPEC.size, train=True, shuffle=True, seed=0,
                device_id=None):  # fmt: skip
    """The baseline-equivalent exercise C: Lab 01's PIL loader."""
    yield from dali_pipeline.pil_loader(files, batch_size, train=train, shuffle=shuffle)


def _unanswered(*args, **kwargs):
    raise NotImplementedError


@needs_dali
def test_dali_sync_pipeline_matches_the_reference_quietly(files):
    from ptcourse.core.quiet import captured_stderr

    with captured_stderr() as said:
        pipe = dali_pipeline.sync_pipeline(_graph(), files, 8, train=False, shuffle=False)
        batches = [dali_pipeline.run_batch(pipe) for _ in range(3)]
    for x, y in batches:
        dali_pipeline.assert_batch_format(x, y, 128)
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


# ---------------------------------------------------------------------------------------------
# The graders: a right, a wrong and a baseline-equivalent answer each, on both tracks


@pytest.fixture
def smoke(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv(checks.SEED_ENV, "11")


@pytest.fixture
def cpu_basic(smoke, monkeypatch):
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu-basic")


def test_sizes_shrink_in_smoke_mode(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = dali_pipeline.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    small = dali_pipeline.sizes()
    assert (full.batch, full.timed_batches) == (64, 2)
    assert (small.batch, small.timed_batches) == (32, 1)
    assert small.equivalence_files < full.equivalence_files and small.subset == full.subset


def test_secret_draw_is_fixed_by_the_secret_seed(smoke):
    a, b = dali_pipeline.secret_draw(), dali_pipeline.secret_draw()
    assert a.files == b.files and (a.batch, a.seed) == (b.batch, b.seed)
    assert 37 <= len(a.files) < 57 and 8 <= a.batch < 17
    assert torch.equal(a.reference, dali_pipeline.reference_batch([p for p, _ in a.files]))


def test_check_dali_without_dali_grades_tvio_batch(cpu_basic, capsys):
    assert dali_pipeline.check_dali(_unanswered, _tvio_batch, points=3) == 3.0
    assert "grading tvio_batch instead" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="tvio_batch does not match"):
        dali_pipeline.check_dali(_unanswered, _unnormalised, points=3)
    per_sample = dali_pipeline.reference_batch  # baseline-equivalent: PIL, one image at a time
    assert dali_pipeline.check_dali(_unanswered, per_sample, points=3) == 3.0


def test_check_speed_without_dali_grades_tvio_equivalence(cpu_basic, capsys):
    assert dali_pipeline.check_speed(_unanswered, _tvio_batch, points=4) == 4.0
    assert "tvio_equivalence" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        dali_pipeline.check_speed(_unanswered, _unnormalised, points=4)
    # a correctness check here: the baseline-equivalent (per-sample PIL) answer is correct
    assert dali_pipeline.check_speed(_unanswered, dali_pipeline.reference_batch, points=4) == 4.0


@needs_dali
def test_check_dali_with_dali(smoke, capsys):
    assert dali_pipeline.check_dali(_loader(_graph()), _unanswered, points=3) == 3.0
    out = capsys.readouterr().out
    assert "inference epoch" in out and "training epoch" in out
    with pytest.raises(checks.CheckFailed, match="must augment"):
        dali_pipeline.check_dali(_loader(_graph(augment=False)), _unanswered, points=3)
    with pytest.raises(checks.CheckFailed, match="NCHW"):
        dali_pipeline.check_dali(_loader(_graph(layout="HWC")), _unanswered, points=3)
    # baseline-equivalent: Lab 01's PIL loader delivers right batches, only slowly
    assert dali_pipeline.check_dali(_pil_loader, _unanswered, points=3) == 3.0


@needs_dali
def test_check_speed_with_dali_times_the_pipeline_against_the_pil_loader(smoke, capsys):
    with measure.pinned_threads(1):
        assert dali_pipeline.check_speed(_graph(), _unanswered, points=4) == 4.0
        assert "throughput" in capsys.readouterr().out
        with pytest.raises(checks.CheckFailed, match="NCHW"):
            dali_pipeline.check_speed(_graph(layout="HWC"), _unanswered, points=4)
        with pytest.raises(checks.CheckFailed, match="zero credit"):
            dali_pipeline.check_speed(_pil_in_dali(), _unanswered, points=4)


def test_check_tvio_visible_grades_tvio_batch_on_every_track(smoke):
    assert dali_pipeline.check_tvio_visible(_tvio_batch, points=1) == 1.0
    with pytest.raises(checks.CheckFailed, match="tvio_batch does not match"):
        dali_pipeline.check_tvio_visible(_unnormalised, points=1)


@needs_dali
def test_the_reference_pipeline_is_the_notebooks_answer(files):
    from nvidia.dali import pipeline_def

    ours = pipeline_def(dali_pipeline.reference_inspection_pipeline)
    for graph_train in (False, True):
        built = [
            dali_pipeline.sync_pipeline(g, files, 8, train=graph_train, shuffle=False, seed=3)
            for g in (ours, _graph())
        ]
        for _ in range(2):
            (x, y), (want_x, want_y) = (dali_pipeline.run_batch(pipe) for pipe in built)
            assert torch.equal(x, want_x) and torch.equal(y, want_y)
    reference = dali_pipeline.ReferencePipeline(files, 8, 0, None)
    assert [len(y) for _, y in reference(2)] == [8, 8]


@needs_dali
def test_timed_batches_must_be_fresh_and_the_graph_dali_operators(files):
    pipe = dali_pipeline.training_pipeline(_graph(), files, 8, 0, None)
    verify = dali_pipeline.timed_batches_check(8, 1, "cpu")
    first = dali_pipeline.run_batches(pipe, 1)
    verify((), first)
    verify((), dali_pipeline.run_batches(pipe, 1))
    with pytest.raises(checks.CheckFailed, match="delivered before"):
        verify((), first)
    with pytest.raises(checks.CheckFailed, match="batch"):
        verify((), [])
    assert "decoders__Image" in dali_pipeline.pipeline_operators(pipe)
    python = dali_pipeline.training_pipeline(_pil_in_dali(), files, 8, 0, None)
    assert any("Python" in op for op in dali_pipeline.pipeline_operators(python))


@needs_dali
def test_where_speed_is_not_gradable_dali_operators_earn_the_points(smoke, monkeypatch, capsys):
    rows = tuple(
        dataclasses.replace(row, target=1000.0, floor=900.0) if row.check == "throughput" else row
        for row in dali_pipeline.TARGETS
    )
    monkeypatch.setattr(dali_pipeline, "TARGETS", rows)
    assert dali_pipeline.check_speed(_graph(), _unanswered, points=4) == 4.0
    assert "not gradable" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="not DALI operators only"):
        dali_pipeline.check_speed(_pil_in_dali(), _unanswered, points=4)
