"""Data-loading pieces for the inspection images (Lab 01; Lab 02 reuses the baseline).

The *baseline* is the pipeline most tutorials write: a ``Dataset`` that opens each JPEG with PIL
and augments one sample at a time with ``torchvision.transforms.v2`` (random resized crop,
horizontal flip, colour jitter, then float conversion and normalisation), fed through a
``DataLoader``. Everything here is importable, so ``DataLoader`` workers can pickle it (classes
defined inside a notebook cannot be sent to spawned workers).

What is *not* here is Lab 01's exercise: the decode-once cache and the batched augmentation.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ptcourse.core import measure

Files = Sequence[tuple[Path, int]]


@dataclass(frozen=True)
class AugmentSpec:
    """The augmentation both the baseline and the exercise apply (RandomResizedCrop defaults)."""

    size: int = 128  # output side: 256x256 JPEGs are cropped and resized to size x size
    scale: tuple[float, float] = (0.08, 1.0)  # crop area as a fraction of the image
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # crop aspect ratio (width / height)
    flip_p: float = 0.5  # probability of a horizontal flip
    brightness: float = 0.4  # brightness factor drawn from [1 - b, 1 + b]
    contrast: float = 0.4  # contrast factor drawn from [1 - c, 1 + c]
    # per-channel statistics of the inspection training images (0..1 scale), for Normalize
    mean: tuple[float, float, float] = (0.494, 0.492, 0.495)
    std: tuple[float, float, float] = (0.123, 0.121, 0.121)

    def value_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Lowest and highest normalised value per channel, as (1, 3, 1, 1) tensors."""
        mean = torch.tensor(self.mean).view(1, 3, 1, 1)
        std = torch.tensor(self.std).view(1, 3, 1, 1)
        return (0 - mean) / std, (1 - mean) / std


SPEC = AugmentSpec()


def decode(path: str | Path) -> torch.Tensor:
    """Decode one JPEG with PIL into a uint8 tensor of shape (3, H, W)."""
    with Image.open(path) as image:
        pixels = np.asarray(image.convert("RGB"))  # H x W x 3
    # numpy makes the channels-first copy: one thread, no OpenMP start-up per image
    return torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1)))


def baseline_transform(spec: AugmentSpec = SPEC) -> v2.Compose:
    """Per-sample augmentation of one decoded image (PIL or uint8 tensor) to a float tensor."""
    return v2.Compose(
        [
            v2.ToImage(),  # the v2 docs' advice: work on uint8 tensors, not PIL images
            v2.RandomResizedCrop(spec.size, scale=spec.scale, ratio=spec.ratio, antialias=True),
            v2.RandomHorizontalFlip(spec.flip_p),
            v2.ColorJitter(brightness=spec.brightness, contrast=spec.contrast),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(spec.mean, spec.std),
        ]
    )


class InspectionDataset(Dataset):
    """The baseline dataset: every access opens and decodes the JPEG, then augments it."""

    def __init__(self, files: Files, transform: Callable[[Any], torch.Tensor] | None = None):
        self.files = [(Path(path), int(label)) for path, label in files]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.files[index]
        with Image.open(path) as image:
            rgb = image.convert("RGB")
        return (self.transform(rgb) if self.transform else v2.functional.pil_to_tensor(rgb)), label


class CachedDataset(Dataset):
    """Per-sample augmentation over already-decoded uint8 images (N, 3, H, W): no decoding."""

    def __init__(
        self,
        images: torch.Tensor,
        labels: torch.Tensor,
        transform: Callable[[Any], torch.Tensor] | None = None,
    ):
        if len(images) != len(labels):
            raise ValueError(f"{len(images)} images but {len(labels)} labels")
        self.images, self.labels, self.transform = images, labels, transform

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        image = self.images[index]
        return (self.transform(image) if self.transform else image), self.labels[index]


def baseline_loader(
    files: Files,
    batch_size: int = 64,
    num_workers: int = 0,
    *,
    pin_memory: bool = False,
    prefetch_factor: int | None = None,
    persistent_workers: bool = False,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
    spec: AugmentSpec = SPEC,
) -> DataLoader:
    """The baseline: ``DataLoader(InspectionDataset(files, baseline_transform()))``.

    The knobs are DataLoader's own; ``prefetch_factor`` and ``persistent_workers`` only apply
    with ``num_workers > 0`` (DataLoader rejects them otherwise, so they are dropped here).
    """
    workers = {}
    if num_workers > 0:
        workers = {"prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers}
    return DataLoader(
        InspectionDataset(files, baseline_transform(spec)),
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        pin_memory=pin_memory,  # without a GPU, DataLoader warns and ignores it
        generator=generator,
        **workers,
    )


def random_crop_boxes(
    n: int,
    height: int,
    width: int,
    generator: torch.Generator,
    scale: tuple[float, float] = SPEC.scale,
    ratio: tuple[float, float] = SPEC.ratio,
    attempts: int = 10,
) -> torch.Tensor:
    """``n`` random crop boxes as RandomResizedCrop draws them, at once: LongTensor (n, 4).

    Each row is ``(top, left, h, w)``. Like torchvision: up to ``attempts`` draws of an area
    fraction in ``scale`` and a log-uniform aspect ratio in ``ratio`` per box; the first draw
    that fits is kept; a box with no fitting draw falls back to a centred crop.
    """
    area = height * width * torch.empty(n, attempts).uniform_(*scale, generator=generator)
    log_ratio = torch.empty(n, attempts).uniform_(
        math.log(ratio[0]), math.log(ratio[1]), generator=generator
    )
    aspect = torch.exp(log_ratio)
    w = torch.sqrt(area * aspect).round().long()
    h = torch.sqrt(area / aspect).round().long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.long().argmax(dim=1, keepdim=True)  # first fitting attempt (0 if none)
    w, h, found = w.gather(1, first)[:, 0], h.gather(1, first)[:, 0], fits.any(dim=1)
    # fallback as torchvision: the whole image, trimmed to the allowed aspect range, centred
    in_ratio = width / height
    if in_ratio < min(ratio):
        fw, fh = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fw, fh = int(round(height * max(ratio))), height
    else:
        fw, fh = width, height
    w = torch.where(found, w, fw)
    h = torch.where(found, h, fh)
    top = (torch.rand(n, generator=generator) * (height - h + 1)).long()
    left = (torch.rand(n, generator=generator) * (width - w + 1)).long()
    top = torch.where(found, top, (height - h) // 2)
    left = torch.where(found, left, (width - w) // 2)
    return torch.stack([top, left, h, w], dim=1)


def take(batches: Iterable[Any], count: int) -> int:
    """Pull ``count`` batches from ``batches``; returns how many samples they held."""
    samples = 0
    for i, batch in enumerate(batches):
        first = batch[0] if isinstance(batch, list | tuple) else batch
        samples += len(first)
        if i + 1 >= count:
            break
    return samples


@dataclass(frozen=True)
class Relative:
    """A throughput divided by a baseline's median: ``ratio`` with its interval."""

    ratio: float
    ci_low: float
    ci_high: float


@dataclass(frozen=True)
class Throughput:
    """Images per second over ``repeats`` timed runs: median with a 95% interval."""

    images_per_s: float
    ci_low: float
    ci_high: float
    repeats: int
    batches: int
    samples: tuple[float, ...] = ()

    def relative_to(self, baseline: Throughput) -> Relative:
        """This throughput as a multiple of ``baseline``'s median (for plots.speedup_bars)."""
        scale = baseline.images_per_s
        return Relative(self.images_per_s / scale, self.ci_low / scale, self.ci_high / scale)

    def summary(self) -> str:
        return (
            f"{self.images_per_s:,.0f} images/s (95% CI {self.ci_low:,.0f}–{self.ci_high:,.0f}; "
            f"{self.repeats} runs × {self.batches} batches)"
        )

    def __str__(self) -> str:
        return self.summary()


def images_per_second(
    make_batches: Callable[[], Iterable[Any]],
    batches: int,
    repeats: int = 5,
    warmup: int = 1,
    threads: int | None = 1,
) -> Throughput:
    """Time ``batches`` batches from a fresh ``make_batches()`` iterator, ``repeats`` times.

    Each run starts a new iteration (for a DataLoader: a new epoch), so the cost of starting
    worker processes is included unless the loader keeps them (``persistent_workers=True``).
    """
    rates = []
    with measure.pinned_threads(threads):
        for run in range(warmup + repeats):
            start = time.perf_counter()
            samples = take(make_batches(), batches)
            elapsed = time.perf_counter() - start
            if run >= warmup:
                rates.append(samples / elapsed)
    values = np.asarray(rates)
    low, high = measure.median_interval(values)
    return Throughput(float(np.median(values)), low, high, repeats, batches, tuple(rates))
