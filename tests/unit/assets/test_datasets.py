"""ptcourse.assets.datasets on the smoke sizes (the full sizes are only checked via generators)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from ptcourse.assets import datasets, text


@pytest.fixture(scope="module")
def smoke_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Both smoke datasets, built once for the whole module."""
    root = tmp_path_factory.mktemp("data")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PTCOURSE_DATA", str(root))
        for name in datasets.SIZES:
            datasets.build(name, smoke=True, progress=False)
    return root


@pytest.fixture
def built(smoke_root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PTCOURSE_DATA", str(smoke_root))
    return smoke_root


def test_dataset_dir_follows_root_and_smoke_switch(tmp_path, monkeypatch):
    monkeypatch.delenv("PTCOURSE_DATA", raising=False)
    monkeypatch.setattr(datasets, "ROOT", tmp_path)
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    assert datasets.dataset_dir("inspection") == tmp_path / "inspection-smoke"
    assert datasets.dataset_dir("headlines", smoke=False) == tmp_path / "headlines-full"
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path / "elsewhere"))
    assert datasets.dataset_dir("inspection", smoke=True) == tmp_path / "elsewhere/inspection-smoke"
    with pytest.raises(ValueError):
        datasets.dataset_dir("mnist")
    with pytest.raises(FileNotFoundError):
        datasets.manifest("inspection", smoke=True)


@pytest.mark.parametrize("name", ["inspection", "headlines"])
def test_build_matches_committed_manifest(built, name):
    # The committed checksum came from an earlier generation, so this also shows determinism;
    # test_damage_is_detected_and_ensure_rebuilds compares two generations in one run.
    local = datasets.manifest(name, smoke=True)
    committed = datasets.committed_manifest(name, smoke=True)
    assert committed is not None, "run `python -m ptcourse.assets.datasets --commit`"
    assert {key: committed[key] for key in local} == local


def test_headlines_generation_is_deterministic():
    assert datasets.generate_headlines(500, seed=7) == datasets.generate_headlines(500, seed=7)
    assert datasets.generate_headlines(500, seed=7) != datasets.generate_headlines(500, seed=8)


def test_inspection_layout(built):
    folder = datasets.dataset_dir("inspection", smoke=True)
    files = datasets.inspection_files(smoke=True)
    per_class = datasets.SIZES["inspection"]["smoke"] // len(datasets.INSPECTION_CLASSES)
    assert datasets.manifest("inspection", smoke=True)["files"] == len(files)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == sorted(
        datasets.INSPECTION_CLASSES
    )
    for label, cls in enumerate(datasets.INSPECTION_CLASSES):
        members = [path for path, y in files if y == label]
        assert len(members) == per_class
        assert all(path.parent.name == cls for path in members)
    for path, _ in files:
        with Image.open(path) as img:
            assert (img.format, img.mode, img.size) == ("JPEG", "RGB", (256, 256))


def test_inspection_splits_are_deterministic_and_stratified(built):
    train, test = datasets.inspection_splits(smoke=True, test_fraction=0.2)
    assert (train, test) == datasets.inspection_splits(smoke=True, test_fraction=0.2)
    assert not set(train) & set(test)
    assert sorted(train + test) == datasets.inspection_files(smoke=True)
    per_class = datasets.SIZES["inspection"]["smoke"] // len(datasets.INSPECTION_CLASSES)
    for label in range(len(datasets.INSPECTION_CLASSES)):
        assert sum(y == label for _, y in test) == round(per_class * 0.2)


def test_damage_is_detected_and_ensure_rebuilds(built, tmp_path, monkeypatch, capsys):
    shutil.copytree(built / "inspection-smoke", tmp_path / "inspection-smoke")
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path))
    assert datasets.verify("inspection", smoke=True)
    files = [path for path, _ in datasets.inspection_files(smoke=True)]
    files[0].unlink()
    files[1].write_bytes(files[1].read_bytes()[:-10] + b"corrupted!")
    assert not datasets.verify("inspection", smoke=True)
    assert capsys.readouterr().out == ""

    datasets.ensure("inspection", smoke=True)
    assert "inspection-smoke corrupt (2 files changed) — rebuilding" in capsys.readouterr().out
    assert datasets.verify("inspection", smoke=True)
    assert files[0].exists()
    original = json.loads((built / "inspection-smoke" / datasets.MANIFEST).read_text())
    assert datasets.manifest("inspection", smoke=True)["checksum"] == original["checksum"]


def test_interrupted_build_is_not_trusted(built, tmp_path, monkeypatch):
    shutil.copytree(built / "headlines-smoke", tmp_path / "headlines-smoke")
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path))
    (tmp_path / "headlines-smoke" / datasets.MANIFEST).unlink()
    assert not datasets.verify("headlines", smoke=True)
    (tmp_path / "headlines-smoke" / "extra.txt").write_text("stray")
    datasets.ensure("headlines", smoke=True, quiet=True)
    assert datasets.verify("headlines", smoke=True)
    assert not (tmp_path / "headlines-smoke" / "extra.txt").exists()


def test_checksum_mismatch_with_committed_is_reported_once(tmp_path, monkeypatch, capsys):
    committed = tmp_path / "repo"
    committed.mkdir()
    fake = {"name": "headlines", "size": "smoke", "checksum": "0" * 64, "made_with": "elsewhere"}
    fake["generator_version"] = datasets.GENERATOR_VERSION
    (committed / "headlines-smoke.manifest.json").write_text(json.dumps(fake))
    monkeypatch.setattr(datasets, "_REPO_DATASETS", committed)
    monkeypatch.setenv("PTCOURSE_DATA", str(tmp_path / "data"))
    datasets.ensure("headlines", smoke=True, quiet=True)
    out = capsys.readouterr().out
    assert out.count("\n") == 1 and "differs from the committed checksum" in out
    datasets.ensure("headlines", smoke=True)  # verifies against the local manifest: no rebuild
    assert capsys.readouterr().out == ""


def test_headlines_load_and_split(built):
    texts, labels = datasets.load_headlines(smoke=True)
    assert len(texts) == len(labels) == datasets.SIZES["headlines"]["smoke"]
    assert len(datasets.HEADLINE_CLASSES) >= 3
    assert set(labels) == set(range(len(datasets.HEADLINE_CLASSES)))
    assert all(text and "\t" not in text and "\n" not in text for text in texts)
    (train_x, train_y), (test_x, test_y) = datasets.headline_splits(smoke=True)
    assert len(test_x) == len(test_y) == round(len(texts) * 0.2)
    assert len(train_x) + len(test_x) == len(texts)
    assert sorted(train_x + test_x) == sorted(texts)
    assert datasets.headline_splits(smoke=True) == ((train_x, train_y), (test_x, test_y))


def test_headlines_full_vocabulary_and_label_noise():
    texts, labels, truth = datasets.generate_headlines(datasets.SIZES["headlines"]["full"], seed=1)
    assert len(text.Vocab.build(texts)) >= 5000
    noise = sum(y != t for y, t in zip(labels, truth, strict=True)) / len(labels)
    assert 0.04 < noise < 0.08


def test_vocab_round_trip_and_padding():
    vocab = text.Vocab.build(["Stocks rise 2.5%", "stocks fall", "Oil rises"])
    assert len(vocab) == 2 + len({"stocks", "rise", "2", ".", "5", "%", "fall", "oil", "rises"})
    ids = vocab.encode("Stocks rise", 5)
    assert ids[2:] == [vocab.PAD] * 3 and vocab.UNK not in ids
    assert vocab.decode(ids) == ["stocks", "rise"]
    assert vocab.encode("gold rises sharply", 4) == [vocab.UNK, vocab.stoi["rises"], 1, 0]
    assert vocab.encode("stocks " * 10, 3) == [vocab.stoi["stocks"]] * 3
    assert vocab.stoi["stocks"] == 2  # most frequent word comes first
    assert len(text.Vocab.build(["a b c d e"], max_size=4)) == 4
    batch = text.encode_batch(["stocks rise", "oil"], vocab, 6)
    assert batch.dtype == torch.long and batch.shape == (2, 6)
    assert batch[1].tolist() == vocab.encode("oil", 6)


def test_inspection_tensors_normalise_per_image_or_per_channel(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    x, y, x_test, _ = datasets.inspection_tensors(16, "image")
    assert x.shape[1:] == (3, 16, 16) and len(x) == len(y)
    assert torch.allclose(x.mean(dim=(1, 2, 3)), torch.zeros(len(x)), atol=1e-5)
    xc, _, _, _ = datasets.inspection_tensors(16, "channel")
    assert torch.allclose(xc.mean(dim=(0, 2, 3)), torch.zeros(3), atol=1e-4)
    with pytest.raises(ValueError):
        datasets.inspection_tensors(16, "pixel")
