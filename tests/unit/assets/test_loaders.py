"""Unit tests for ptcourse.assets.loaders (the baseline pipeline and its reusable pieces)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch
from PIL import Image

from ptcourse.assets import datasets, loaders


@pytest.fixture(scope="module")
def files() -> list:
    return datasets.inspection_files(smoke=True)[:24]


def test_decode_is_pil_exact(files):
    path = files[0][0]
    image = loaders.decode(path)
    expected = np.asarray(Image.open(path).convert("RGB"))
    assert image.dtype == torch.uint8
    assert image.shape == (3, 256, 256)
    assert image.is_contiguous()
    assert np.array_equal(image.permute(1, 2, 0).numpy(), expected)


def test_baseline_transform_output(files):
    spec = loaders.SPEC
    x = loaders.baseline_transform()(loaders.decode(files[1][0]))
    low, high = spec.value_range()
    assert x.shape == (3, spec.size, spec.size)
    assert x.dtype == torch.float32
    assert (x >= low[0] - 1e-4).all() and (x <= high[0] + 1e-4).all()


def test_dataset_and_loader_batches(files):
    dataset = loaders.InspectionDataset(files)
    raw, label = dataset[3]
    assert raw.dtype == torch.uint8 and raw.shape == (3, 256, 256)
    assert label == files[3][1]
    loader = loaders.baseline_loader(
        files, batch_size=8, prefetch_factor=2, persistent_workers=True
    )
    x, y = next(iter(loader))  # the worker-only knobs are dropped for num_workers=0
    assert x.shape == (8, 3, loaders.SPEC.size, loaders.SPEC.size) and x.dtype == torch.float32
    assert y.dtype == torch.int64 and len(y) == 8


def test_loader_with_a_worker(files):
    loader = loaders.baseline_loader(files[:8], batch_size=4, num_workers=1, prefetch_factor=2)
    assert loaders.take(loader, 2) == 8


def test_dataset_pickles_for_spawned_workers(files):
    dataset = loaders.InspectionDataset(files, loaders.baseline_transform())
    clone = pickle.loads(pickle.dumps(dataset))
    assert len(clone) == len(dataset)
    assert clone[0][0].shape == (3, loaders.SPEC.size, loaders.SPEC.size)


def test_cached_dataset(files):
    images = torch.stack([loaders.decode(p) for p, _ in files[:4]])
    labels = torch.tensor([label for _, label in files[:4]])
    dataset = loaders.CachedDataset(images, labels, loaders.baseline_transform())
    x, y = dataset[2]
    assert x.shape == (3, loaders.SPEC.size, loaders.SPEC.size)
    assert y == labels[2]
    with pytest.raises(ValueError):
        loaders.CachedDataset(images, labels[:3])


def test_random_crop_boxes_follow_the_spec():
    g = torch.Generator().manual_seed(0)
    boxes = loaders.random_crop_boxes(2000, 256, 256, g)
    top, left, h, w = boxes.unbind(1)
    assert boxes.dtype == torch.int64 and boxes.shape == (2000, 4)
    assert (top >= 0).all() and (left >= 0).all()
    assert (top + h <= 256).all() and (left + w <= 256).all()
    area = (h * w).float() / 256**2
    assert area.min() > 0.07 and area.max() <= 1.0
    assert area.quantile(0.1) < 0.25 and area.quantile(0.9) > 0.7
    aspect = w.float() / h.float()
    assert aspect.min() > 0.7 and aspect.max() < 1.4
    again = loaders.random_crop_boxes(2000, 256, 256, torch.Generator().manual_seed(0))
    assert torch.equal(boxes, again)


def test_random_crop_boxes_fall_back_to_a_centred_crop():
    g = torch.Generator().manual_seed(0)
    # an area larger than the image never fits: torchvision falls back to the whole image
    boxes = loaders.random_crop_boxes(5, 100, 100, g, scale=(2.0, 3.0))
    assert boxes.tolist() == [[0, 0, 100, 100]] * 5
    # a very wide image: the fallback trims it to the largest allowed aspect ratio
    wide = loaders.random_crop_boxes(3, 100, 400, g, scale=(2.0, 3.0))
    assert wide.tolist() == [[0, 133, 100, 133]] * 3


def test_take_counts_samples():
    batches = [(torch.zeros(4, 2), torch.zeros(4)), (torch.zeros(3, 2), torch.zeros(3))]
    assert loaders.take(batches, 1) == 4
    assert loaders.take(batches, 5) == 7
    assert loaders.take([torch.zeros(6, 1)], 1) == 6


def test_images_per_second_and_relative():
    batches = [(torch.zeros(16, 3), torch.zeros(16))] * 4
    result = loaders.images_per_second(lambda: iter(batches), batches=4, repeats=3)
    assert result.images_per_s > 0
    assert result.ci_low <= result.images_per_s <= result.ci_high
    assert len(result.samples) == 3
    assert "images/s" in result.summary()
    relative = result.relative_to(result)
    assert relative.ratio == pytest.approx(1.0)
    assert relative.ci_low <= 1.0 <= relative.ci_high


def test_spec_value_range_and_replace():
    low, high = loaders.SPEC.value_range()
    assert low.shape == (1, 3, 1, 1) and (low < 0).all() and (high > 0).all()
    plain = dataclasses.replace(loaders.SPEC, brightness=0.0)
    assert plain.brightness == 0.0 and plain.size == loaders.SPEC.size
