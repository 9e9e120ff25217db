"""Deterministic, download-free datasets with manifests and checksums.

Two datasets, each in a ``full`` and a ``smoke`` size:

- **inspection**: synthetic industrial-surface photos (brushed metal, woven fabric, cast grain),
  256x256 RGB JPEG in class folders ``clean/ scratch/ spot/ crack/``.
- **headlines**: synthetic financial-news headlines in four topics, one TSV file.

Every build writes ``manifest.json`` into the dataset folder *last* (so an interrupted build is
detected) with a sha256 per file; :func:`verify` checks against it and :func:`ensure` rebuilds
when anything is missing or changed. ``datasets/<name>-<size>.manifest.json`` in the repository
holds the checksum this generator version produced for the authors; a build that differs (another
numpy / Pillow / libjpeg) says so in one line and carries on.

Data lives under ``$PTCOURSE_DATA`` if set, else ``<repo>/datasets``.
``python -m ptcourse.assets.datasets`` builds all four; ``--commit`` also rewrites the committed
manifests (authors only).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import math
import multiprocessing
import os
import random
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from PIL import Image, ImageDraw
from scipy import ndimage
from tqdm import tqdm

from ptcourse.core import smoke as _smoke
from ptcourse.core.errors import CourseInputError

if TYPE_CHECKING:
    import torch

if TYPE_CHECKING:
    pass

_REPO_DATASETS = Path(__file__).resolve().parents[2] / "datasets"
ROOT: Path = Path(os.environ.get("PTCOURSE_DATA") or _REPO_DATASETS)
GENERATOR_VERSION = 1
MANIFEST = "manifest.json"

INSPECTION_CLASSES = ("clean", "scratch", "spot", "crack")
HEADLINE_CLASSES = ("earnings", "mergers", "markets", "macro")
IMAGE_SIZE = 256
JPEG_QUALITY = 90
HEADLINE_NOISE = 0.06
HEADLINES_FILE = "headlines.tsv"

SIZES = {
    "inspection": {"full": 2400, "smoke": 320},
    "headlines": {"full": 24000, "smoke": 4000},
}
SEEDS = {"inspection": 20261202, "headlines": 20261203}
SPLIT_SEED = 12345


# ---------------------------------------------------------------------------------------------
# Paths and manifests


def data_root() -> Path:
    """Where the datasets live (``PTCOURSE_DATA`` or the repository's ``datasets/``)."""
    # Read the variable at call time so tests and notebooks can redirect after import.
    env = os.environ.get("PTCOURSE_DATA")
    return Path(env) if env else ROOT


_root = data_root


def _size(smoke: bool | None) -> str:
    if smoke is None:
        smoke = _smoke.is_smoke()
    return "smoke" if smoke else "full"


class UnknownDataset(CourseInputError, ValueError):
    """A dataset name that is not one of :data:`SIZES` (a ValueError, as a bad argument)."""


def _check_name(name: str) -> None:
    if name not in SIZES:
        raise UnknownDataset(
            f"unknown dataset {name!r}: the datasets are {', '.join(sorted(SIZES))}"
        )


def dataset_dir(name: str, smoke: bool | None = None) -> Path:
    """Folder of dataset ``name`` (``inspection`` or ``headlines``) in the active size."""
    _check_name(name)
    return _root() / f"{name}-{_size(smoke)}"


def committed_manifest_path(name: str, smoke: bool | None = None) -> Path:
    """Where the repository keeps the expected manifest of ``name`` in this size."""
    return _REPO_DATASETS / f"{name}-{_size(smoke)}.manifest.json"


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _total_checksum(file_hashes: dict[str, str]) -> str:
    lines = "".join(f"{path}\t{digest}\n" for path, digest in sorted(file_hashes.items()))
    return _sha256(lines.encode())


def _made_with() -> str:
    import PIL
    from PIL import features

    jpeg = features.version("libjpeg_turbo") or features.version("jpg")
    return f"numpy {np.__version__}, Pillow {PIL.__version__}, libjpeg {jpeg}"


_SUMMARY_KEYS = ("name", "size", "seed", "files", "checksum", "generator_version")


def _summary(name: str, size: str, file_hashes: dict[str, str]) -> dict:
    return {
        "name": name,
        "size": size,
        "seed": SEEDS[name],
        "files": len(file_hashes),
        "checksum": _total_checksum(file_hashes),
        "generator_version": GENERATOR_VERSION,
    }


def _read_local(name: str, smoke: bool | None) -> dict | None:
    try:
        return json.loads((dataset_dir(name, smoke) / MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def manifest(name: str, smoke: bool | None = None) -> dict:
    """Summary of the dataset as built on this machine (no per-file table).

    Keys: name, size, seed, files (count), checksum (sha256 over sorted (relpath, sha256)
    pairs), generator_version. Raises FileNotFoundError if it was never built: call ensure().
    """
    local = _read_local(name, smoke)
    if local is None:
        raise FileNotFoundError(f"{dataset_dir(name, smoke)} has no manifest; call ensure()")
    return {key: local[key] for key in _SUMMARY_KEYS}


def committed_manifest(name: str, smoke: bool | None = None) -> dict | None:
    """The manifest the authors committed for this generator version, or None if absent."""
    try:
        return json.loads(committed_manifest_path(name, smoke).read_text())
    except (OSError, ValueError):
        return None


def _problem(name: str, smoke: bool | None) -> str | None:
    """Why the dataset on disk is not usable, or None when it verifies."""
    folder = dataset_dir(name, smoke)
    if not folder.is_dir():
        return "missing"
    local = _read_local(name, smoke)
    if local is None:
        return "incomplete (no manifest: an interrupted build?)"
    if local.get("generator_version") != GENERATOR_VERSION or local.get("seed") != SEEDS[name]:
        return f"outdated (generator version {local.get('generator_version')})"
    expected: dict[str, str] = local["sha256"]
    on_disk = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    on_disk.discard(MANIFEST)
    changed = len(on_disk ^ expected.keys())
    changed += sum(
        _sha256((folder / rel).read_bytes()) != digest
        for rel, digest in expected.items()
        if rel in on_disk
    )
    if changed:
        return f"corrupt ({changed} file{'s' * (changed != 1)} changed)"
    if _total_checksum(expected) != local["checksum"]:
        return "corrupt (manifest edited)"
    return None


def verify(name: str, smoke: bool | None = None) -> bool:
    """True iff the dataset folder exists and every file matches the manifest written at build."""
    return _problem(name, smoke) is None


def ensure(name: str, smoke: bool | None = None, quiet: bool = False) -> Path:
    """Return the dataset folder, (re)building it first if it is missing or does not verify."""
    problem = _problem(name, smoke)
    if problem is None:
        return dataset_dir(name, smoke)
    if not quiet:
        print(f"{name}-{_size(smoke)} {problem} — rebuilding…", flush=True)
    return build(name, smoke, progress=not quiet)


def build(name: str, smoke: bool | None = None, progress: bool = True) -> Path:
    """Generate dataset ``name`` from scratch (replacing any old copy); return its folder.

    Files are written to a temporary sibling folder that is renamed into place at the end, and
    the manifest is written last, so an interrupted build is never mistaken for a complete one.
    """
    size = _size(smoke)
    final = dataset_dir(name, smoke)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    writer = _write_inspection if name == "inspection" else _write_headlines
    bar = f"{name}-{size}" if progress else ""  # "" means no progress bar
    try:
        file_hashes = writer(tmp, SIZES[name][size], SEEDS[name], bar)
        summary = _summary(name, size, file_hashes)
        local = {**summary, "made_with": _made_with(), "sha256": dict(sorted(file_hashes.items()))}
        (tmp / MANIFEST).write_text(json.dumps(local, indent=1) + "\n")
        shutil.rmtree(final, ignore_errors=True)
        try:
            tmp.rename(final)
        except OSError:
            # Another process (notebooks run in parallel) may have put its own build in place.
            if not verify(name, smoke):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    _compare_with_committed(summary)
    return final


def _compare_with_committed(summary: dict) -> None:
    committed = committed_manifest(summary["name"], summary["size"] == "smoke")
    if committed is None or committed.get("generator_version") != GENERATOR_VERSION:
        return
    if committed["checksum"] != summary["checksum"]:
        print(
            f"note: {summary['name']}-{summary['size']} differs from the committed checksum "
            f"(made here with {_made_with()}; authors used {committed.get('made_with', '?')}); "
            "the data is still valid for the course.",
            flush=True,
        )


def write_committed_manifest(name: str, smoke: bool | None = None) -> Path:
    """Authors only: build afresh and record the result as the expected manifest in the repo."""
    build(name, smoke)
    path = committed_manifest_path(name, smoke)
    summary = {**manifest(name, smoke), "made_with": _made_with()}
    path.write_text(json.dumps(summary, indent=1) + "\n")
    return path


def _run(
    job: Callable[[tuple[Path, int, int]], tuple[str, str]],
    args: list[tuple[Path, int, int]],
    label: str,
) -> dict[str, str]:
    """Run ``job`` over ``args`` (in a process pool when it pays off) with a progress bar.

    The bar goes to stdout: nbgrader scores a test cell that prints to stderr as failed.
    """
    workers = min(os.cpu_count() or 1, 8)
    serial = workers < 2 or len(args) < 100
    pool = contextlib.nullcontext() if serial else multiprocessing.get_context().Pool(workers)
    bar = tqdm(total=len(args), desc=label, disable=not label, file=sys.stdout, leave=False)
    hashes = {}
    with bar, pool:
        results = map(job, args) if serial else pool.imap_unordered(job, args, chunksize=16)
        for rel, digest in results:
            hashes[rel] = digest
            bar.update()
    return hashes


# ---------------------------------------------------------------------------------------------
# inspection: textured surfaces with defects


def _tint(rng: np.random.Generator, spread: float) -> np.ndarray:
    # float32 throughout: float64 colour factors would upcast every image and double its cost
    return (1 + rng.uniform(-spread, spread, 3)).astype(np.float32)


def _brushed_metal(rng: np.random.Generator) -> np.ndarray:
    big = int(IMAGE_SIZE * 1.42) + 2  # room to rotate without empty corners
    streak = int(rng.integers(12, 60))
    noise = rng.standard_normal((big, big)).astype(np.float32)
    noise = ndimage.uniform_filter1d(noise, streak, axis=1) * math.sqrt(streak)
    turned = Image.fromarray(noise).rotate(
        float(rng.uniform(0, 180)), resample=Image.Resampling.BILINEAR
    )
    lo = (big - IMAGE_SIZE) // 2
    gray = np.asarray(turned)[lo : lo + IMAGE_SIZE, lo : lo + IMAGE_SIZE]
    gray = rng.uniform(0.35, 0.7) + rng.uniform(0.02, 0.06) * gray
    return gray[..., None] * _tint(rng, 0.06)


@functools.cache
def _xy() -> np.ndarray:
    return np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE].astype(np.float32)


def _grid(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Pixel coordinates rotated by a random angle."""
    angle = rng.uniform(0, math.pi)
    y, x = _xy()
    return x * math.cos(angle) + y * math.sin(angle), -x * math.sin(angle) + y * math.cos(angle)


def _woven_fabric(rng: np.random.Generator) -> np.ndarray:
    u, v = _grid(rng)
    period = rng.uniform(4, 12)
    weave = np.sin(2 * np.pi * u / period) * np.sin(2 * np.pi * v / (period * rng.uniform(1, 2)))
    fuzz = ndimage.gaussian_filter(rng.standard_normal(u.shape).astype(np.float32), 1.0)
    gray = rng.uniform(0.35, 0.7) + rng.uniform(0.04, 0.1) * weave + 0.04 * fuzz
    color = rng.uniform(0.6, 1.0, 3).astype(np.float32)
    return gray[..., None] * (color / color.mean())


def _cast_grain(rng: np.random.Generator) -> np.ndarray:
    noise = rng.standard_normal((IMAGE_SIZE, IMAGE_SIZE)).astype(np.float32)
    sigma = rng.uniform(0.8, 3.0)
    grain = ndimage.gaussian_filter(noise, sigma) * sigma * 1.5
    gray = rng.uniform(0.3, 0.65) + rng.uniform(0.03, 0.08) * grain
    return gray[..., None] * _tint(rng, 0.05)


def _lighting(rng: np.random.Generator) -> np.ndarray:
    """A gentle linear illumination gradient shared by all classes."""
    u, _ = _grid(rng)
    return 1 + rng.uniform(0, 0.25) * (u / IMAGE_SIZE - 0.5)


def _canvas() -> tuple[Image.Image, ImageDraw.ImageDraw]:
    # Masks are drawn at 2x and shrunk for anti-aliased edges.
    mask = Image.new("L", (2 * IMAGE_SIZE, 2 * IMAGE_SIZE))
    return mask, ImageDraw.Draw(mask)


def _finish(mask: Image.Image, blur: float) -> np.ndarray:
    small = np.asarray(mask.resize((IMAGE_SIZE, IMAGE_SIZE), Image.Resampling.BOX), np.float32)
    small = small / 255
    return ndimage.gaussian_filter(small, blur) if blur > 0 else small


def _scratch(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    mask, draw = _canvas()
    length = rng.uniform(40, 200) * 2
    angle = rng.uniform(0, 2 * math.pi)
    cx, cy = rng.uniform(96, 2 * IMAGE_SIZE - 96, 2)  # centre well inside: half of it shows
    bend = rng.uniform(-0.1, 0.1)
    points = [
        (cx + t * length * math.cos(angle + bend * t), cy + t * length * math.sin(angle + bend * t))
        for t in np.linspace(-0.5, 0.5, 8)
    ]
    draw.line(points, fill=255, width=int(rng.integers(3, 7)))
    contrast = rng.uniform(0.15, 0.45) * (1 if rng.random() < 0.75 else -1)  # mostly reflective
    return img + contrast * _finish(mask, rng.uniform(0, 0.5))[..., None]


def _spot(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    mask, draw = _canvas()
    rx, ry = rng.uniform(8, 44, 2)
    cx, cy = rng.uniform(50, 2 * IMAGE_SIZE - 50, 2)
    turn = rng.uniform(0, math.pi)
    t = np.linspace(0, 2 * math.pi, 40, endpoint=False)
    wobble = 1 + 0.12 * rng.standard_normal(40)
    ex, ey = rx * np.cos(t) * wobble, ry * np.sin(t) * wobble
    xs = cx + ex * math.cos(turn) - ey * math.sin(turn)
    ys = cy + ex * math.sin(turn) + ey * math.cos(turn)
    draw.polygon(list(zip(xs.tolist(), ys.tolist(), strict=True)), fill=255)
    alpha = _finish(mask, rng.uniform(1, 4))[..., None]
    stain = rng.uniform(0.2, 0.6) * rng.choice([-1, 1]) * _tint(rng, 0.3)  # oil or residue
    return img * (1 + stain * alpha)


def _walk(
    rng: np.random.Generator, start: tuple[float, float], heading: float, steps: int
) -> list[tuple[float, float]]:
    """A jagged path: each step zigzags around a slowly drifting direction."""
    x, y = start
    points = [(x, y)]
    for _ in range(steps):
        heading += rng.normal(0, 0.12)
        turn = heading + rng.normal(0, 0.7)
        step = rng.uniform(8, 20)
        x, y = x + step * math.cos(turn), y + step * math.sin(turn)
        points.append((x, y))
    return points


def _crack(rng: np.random.Generator, img: np.ndarray) -> np.ndarray:
    mask, draw = _canvas()
    start = tuple(rng.uniform(80, 2 * IMAGE_SIZE - 80, 2))
    heading = rng.uniform(0, 2 * math.pi)
    main = _walk(rng, start, heading, int(rng.integers(10, 30)))
    draw.line(main, fill=255, width=int(rng.integers(4, 8)), joint="curve")
    for _ in range(int(rng.integers(2, 6))):
        fork = main[int(rng.integers(1, len(main)))]
        branch = _walk(rng, fork, heading + rng.choice([-1, 1]) * rng.uniform(0.5, 1.3), 8)
        draw.line(branch[: int(rng.integers(3, 9))], fill=255, width=3)
    darkness = rng.uniform(0.35, 0.8)
    return img * (1 - darkness * _finish(mask, rng.uniform(0, 0.6))[..., None])


_TEXTURES = (_brushed_metal, _woven_fabric, _cast_grain)
_DEFECTS = {"scratch": _scratch, "spot": _spot, "crack": _crack}


def inspection_image(seed: int, index: int) -> tuple[np.ndarray, int]:
    """Image ``index`` of the inspection set as uint8 HxWx3, and its class index."""
    rng = np.random.default_rng([seed, index])
    label = index % len(INSPECTION_CLASSES)
    img = _TEXTURES[int(rng.integers(len(_TEXTURES)))](rng) * _lighting(rng)[..., None]
    defect = _DEFECTS.get(INSPECTION_CLASSES[label])
    if defect is not None:
        img = defect(rng, img)
    grain = rng.standard_normal(img.shape[:2], dtype=np.float32)[..., None]  # sensor noise
    img = img * 255 + (rng.uniform(1, 5) * grain + 0.5)
    return np.clip(img, 0, 255, out=img).astype(np.uint8), label


def camera_shot(seed: int, index: int, side: int = 1024) -> tuple[bytes, int]:
    """Image ``index`` as a camera on the line delivers it: upscaled to ``side`` x ``side``
    (bilinear) and JPEG-encoded (quality 90); and its class index. About 11 ms on one core."""
    pixels, label = inspection_image(seed, index)
    frame = Image.fromarray(pixels).resize((side, side), Image.Resampling.BILINEAR)
    buffer = io.BytesIO()
    frame.save(buffer, format="JPEG", quality=JPEG_QUALITY)
    return buffer.getvalue(), label


def _inspection_job(args: tuple[Path, int, int]) -> tuple[str, str]:
    folder, seed, index = args
    pixels, label = inspection_image(seed, index)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    cls = INSPECTION_CLASSES[label]
    rel = f"{cls}/{cls}_{index:05d}.jpg"
    (folder / rel).write_bytes(buffer.getvalue())
    return rel, _sha256(buffer.getvalue())


def _write_inspection(folder: Path, count: int, seed: int, bar: str) -> dict[str, str]:
    for cls in INSPECTION_CLASSES:
        (folder / cls).mkdir()
    return _run(_inspection_job, [(folder, seed, i) for i in range(count)], bar)


def inspection_files(smoke: bool | None = None) -> list[tuple[Path, int]]:
    """Sorted ``(path, class index)`` pairs of the inspection set (built first if needed)."""
    folder = ensure("inspection", smoke)
    return sorted(
        (path, label)
        for label, cls in enumerate(INSPECTION_CLASSES)
        for path in (folder / cls).glob("*.jpg")
    )


def inspection_splits(
    smoke: bool | None = None, test_fraction: float = 0.2
) -> tuple[list[tuple[Path, int]], list[tuple[Path, int]]]:
    """Deterministic split of :func:`inspection_files`, stratified by class: (train, test)."""
    rng = np.random.default_rng(SPLIT_SEED)
    files = inspection_files(smoke)
    train: list[tuple[Path, int]] = []
    test: list[tuple[Path, int]] = []
    for label in range(len(INSPECTION_CLASSES)):
        members = [item for item in files if item[1] == label]
        order = rng.permutation(len(members))
        n_test = round(len(members) * test_fraction)
        test += [members[i] for i in order[:n_test]]
        train += [members[i] for i in order[n_test:]]
    return sorted(train), sorted(test)


@functools.cache
def _inspection_pixels(side: int, smoke: bool) -> tuple[torch.Tensor, ...]:
    import torch  # lazy: pool workers that only build data need not load torch

    def stack(files: list[tuple[Path, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        pixels = []
        for path, _ in files:
            with Image.open(path) as image:
                small = image.convert("RGB").resize((side, side), Image.Resampling.BILINEAR)
            pixels.append(np.asarray(small).transpose(2, 0, 1))
        x = torch.from_numpy(np.stack(pixels)).float() / 255
        return x, torch.tensor([label for _, label in files])

    train, test = inspection_splits(smoke)
    return (*stack(train), *stack(test))


def inspection_tensors(
    side: int, normalize: str = "image", smoke: bool | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x_train, y_train, x_test, y_test): the inspection split at ``side`` x ``side`` (PIL
    bilinear resize), decoded once per process. ``normalize="image"`` standardises each image
    to mean 0, std 1 (the textures differ in tint and brightness, the defects in local
    contrast); ``"channel"`` uses the training split's per-channel mean and std."""
    x_train, y_train, x_test, y_test = _inspection_pixels(
        side, _smoke.is_smoke() if smoke is None else smoke
    )
    if normalize == "image":

        def scale(x: torch.Tensor) -> torch.Tensor:
            return (x - x.mean(dim=(1, 2, 3), keepdim=True)) / x.std(dim=(1, 2, 3), keepdim=True)

        return scale(x_train), y_train, scale(x_test), y_test
    if normalize == "channel":
        mean = x_train.mean(dim=(0, 2, 3), keepdim=True)
        std = x_train.std(dim=(0, 2, 3), keepdim=True)
        return (x_train - mean) / std, y_train, (x_test - mean) / std, y_test
    raise ValueError(f"normalize must be 'image' or 'channel', not {normalize!r}")


# ---------------------------------------------------------------------------------------------
# headlines: synthetic financial news

_SYLLABLES = [
    "ac", "al", "an", "ar", "ba", "bel", "bri", "ca", "cor", "da", "del", "dor", "el", "en", "fa",
    "fin", "ga", "gen", "hal", "in", "jo", "ka", "kel", "ken", "lo", "lu", "ma", "mar", "mer", "mo",
    "na", "nex", "nor", "o", "pa", "per", "pra", "qua", "ra", "ri", "ro", "sa", "sen", "sil", "sol",
    "ta", "ter", "tra", "tri", "ul", "va", "ven", "vi", "vo", "xa", "za", "zen", "zor",
]  # fmt: skip
_SUFFIXES = ["Corp", "Group", "Holdings", "Inc", "Labs", "Systems", "Energy", "Bank", "Motors",
             "Pharma", "Foods", "Tech"]  # fmt: skip
_WORDS = {
    "q": ["Q1", "Q2", "Q3", "Q4", "first-quarter", "second-quarter", "third-quarter",
          "fourth-quarter", "half-year", "annual"],
    "beat": ["beats", "misses", "tops", "trails", "matches", "exceeds", "falls short of"],
    # singular and plural verbs of moving up and down
    "up": ["rises", "jumps", "climbs", "gains", "surges", "edges up", "rallies", "advances"],
    "rise": ["rise", "jump", "climb", "gain", "surge", "edge up", "rally", "advance"],
    "down": ["falls", "drops", "slides", "sinks", "tumbles", "edges down", "slumps", "retreats"],
    "fall": ["fall", "drop", "slide", "sink", "tumble", "edge down", "slump", "retreat"],
    "segment": ["cloud", "retail", "advertising", "chip", "insurance", "lending", "travel",
                "streaming", "battery", "drug"],
    "index": ["S&P 500", "Nasdaq", "Dow", "FTSE 100", "DAX", "Nikkei", "Hang Seng",
              "Stoxx 600", "CAC 40", "Sensex"],
    "sector": ["tech", "bank", "energy", "mining", "utility", "healthcare", "airline",
               "retail", "property", "auto"],
    "asset": ["oil", "gold", "copper", "the dollar", "the euro", "the yen", "Bitcoin", "wheat",
              "natural gas", "silver"],
    "region": ["US", "euro zone", "UK", "China", "Japan", "Germany", "India", "Brazil",
               "Canada", "Australia"],
    "bank": ["Fed", "ECB", "Bank of England", "Bank of Japan", "central bank", "RBA", "PBOC",
             "SNB"],
    "stat": ["inflation", "unemployment", "retail spending", "factory output", "the CPI",
             "wage growth", "home building", "the PMI", "the trade surplus", "core inflation"],
    "month": ["January", "February", "March", "April", "May", "June", "July", "August",
              "September", "October", "November", "December"],
    "deal": ["takeover", "merger", "buyout", "acquisition", "tie-up", "all-stock deal",
             "cash deal", "bid"],
    "buy": ["to buy", "to acquire", "agrees to buy", "in talks to buy", "bids for",
            "nears deal for", "weighs offer for"],
    "mood": ["rate-cut hopes", "inflation worries", "earnings season", "merger talk",
             "trade tensions", "recession fears", "strong jobs data", "tariff news",
             "bond market jitters", "a weak dollar"],
    "when": ["on Monday", "on Tuesday", "on Wednesday", "on Thursday", "on Friday",
             "in early trading", "after the bell", "overnight", "this week", "late on Friday"],
    "said": ["analysts say", "sources say", "people familiar say", "filing shows",
             "report says", "CEO says", "traders say", "economists say"],
}  # fmt: skip
_TEMPLATES = {
    "earnings": [
        "{co} {q} profit {up} {pct} , {beat} estimates",
        "{co} ( {tk} ) posts {q} loss as {segment} sales {fall}",
        "{co} raises full-year guidance after {segment} revenue {up} {pct}",
        "{co} cuts outlook ; {q} earnings per share of {cents} {beat} forecasts",
        "{co} {q} revenue {up} to {money} on strong {segment} demand",
        "{co} shares {fall} {pct} after {q} profit {beat} expectations",
        "{co} lifts dividend to {cents} a share as profit {up}",
        "{tk} : {q} net income {money} vs {money} a year ago",
        "{co} warns on profit as {segment} margins {fall}",
    ],
    "mergers": [
        "{co} {buy} {co2} for {money}",
        "{co2} rejects {money} {deal} offer from {co}",
        "{co} and {co2} agree {deal} , {said}",
        "{co} takes {pct} stake in {co2}",
        "regulators clear {co} {deal} of {co2}",
        "{co} shares {rise} {pct} on report of {deal} interest from {co2}",
        "{person} to lead combined {co} after {deal} with {co2}",
        "{co} sells {segment} unit to {co2} for {money}",
        "{co2} board backs {co} {deal} ; {tk} {up}",
    ],
    "markets": [
        "{index} {up} {pct} as {sector} stocks lead gains",
        "{index} {down} {pct} , dragged by {sector} shares",
        "{asset} {up} to {money} as traders weigh {mood}",
        "{asset} {down} {pct} on {mood}",
        "stocks {fall} as {sector} shares slide ; {co} {down} {pct}",
        "{index} futures {rise} ahead of {mood}",
        "Treasury yields {rise} to {pct} as investors eye {mood}",
        "{sector} shares {rise} ; {tk} among top gainers on the {index}",
        "volatility index {up} as {index} {down} {pct}",
    ],
    "macro": [
        "{region} {stat} {up} to {pct} in {month}",
        "{region} {stat} {down} to {pct} in {month} , {said}",
        "{bank} holds rates at {pct} , signals patience",
        "{bank} raises rates to {pct} to fight {stat}",
        "{bank} cuts rates by {bps} basis points as {stat} {down}",
        "{region} GDP {up} {pct} in {q} , beating forecasts",
        "{region} economy shrinks {pct} as {stat} {down}",
        "{person} of the {bank} says {stat} risks remain",
        "{region} jobless claims {rise} to {thousands} in {month}",
    ],
}
# Headlines any desk could have written: they make some labels genuinely ambiguous.
_SHARED = [
    "{co} shares {rise} {pct} {when}",
    "{co} shares {fall} {pct} amid {mood}",
    "{tk} {up} {pct} , {said}",
    "what {mood} means for {co} and the {index}",
]


def _names(rng: random.Random, count: int) -> dict[str, list[str]]:
    """Made-up companies, tickers and people, built from syllables."""
    companies: set[str] = set()
    while len(companies) < count:
        stem = "".join(rng.choices(_SYLLABLES, k=rng.randint(2, 3))).capitalize()
        companies.add(stem if rng.random() < 0.4 else f"{stem} {rng.choice(_SUFFIXES)}")
    tickers = {"".join(rng.choices(_SYLLABLES, k=2))[:4].upper() for _ in range(count // 2)}
    people = [
        " ".join("".join(rng.choices(_SYLLABLES, k=k)).capitalize() for k in (2, 3))
        for _ in range(count // 6)
    ]
    return {"co": sorted(companies), "tk": sorted(tickers), "person": people}


class _Slots(dict):
    """Template slots drawn on demand; ``{money}`` twice in one template gives two amounts."""

    def __init__(self, rng: random.Random, names: dict[str, list[str]]) -> None:
        super().__init__()
        self.rng, self.names = rng, names

    def __missing__(self, key: str) -> str:
        rng = self.rng
        if key in _WORDS:
            return rng.choice(_WORDS[key])
        if key in ("co", "co2"):
            return rng.choice(self.names["co"])
        if key in self.names:
            return rng.choice(self.names[key])
        return {
            "pct": lambda: f"{rng.uniform(0.1, 12):.1f}%",
            "bps": lambda: str(rng.choice([10, 25, 50, 75])),
            "cents": lambda: f"{rng.randint(5, 400)} cents",
            "money": lambda: f"${rng.randint(1, 999)}{rng.choice(['m', 'bn'])}",
            "thousands": lambda: f"{rng.randint(180, 320)},000",
        }[key]()


def generate_headlines(count: int, seed: int) -> tuple[list[str], list[int], list[int]]:
    """``count`` headlines: (texts, labels with ~6% flipped at random, true labels)."""
    rng = random.Random(seed)
    names = _names(rng, 2600)
    rows = []
    for i in range(count):
        topic = i % len(HEADLINE_CLASSES)
        pool = _SHARED if rng.random() < 0.08 else _TEMPLATES[HEADLINE_CLASSES[topic]]
        text = rng.choice(pool).format_map(_Slots(rng, names))
        if rng.random() < 0.3:
            text += " " + rng.choice(_WORDS["when"])
        label = topic
        if rng.random() < HEADLINE_NOISE:
            label = (topic + rng.randint(1, len(HEADLINE_CLASSES) - 1)) % len(HEADLINE_CLASSES)
        rows.append((text[0].upper() + text[1:], label, topic))
    rng.shuffle(rows)
    texts, labels, truth = zip(*rows, strict=True)
    return list(texts), list(labels), list(truth)


def _write_headlines(folder: Path, count: int, seed: int, bar: str) -> dict[str, str]:
    del bar  # under a second: no progress bar needed
    texts, labels, _ = generate_headlines(count, seed)
    rows = ["label\ttext"]
    rows += [f"{HEADLINE_CLASSES[y]}\t{t}" for t, y in zip(texts, labels, strict=True)]
    payload = ("\n".join(rows) + "\n").encode()
    (folder / HEADLINES_FILE).write_bytes(payload)
    return {HEADLINES_FILE: _sha256(payload)}


def load_headlines(smoke: bool | None = None) -> tuple[list[str], list[int]]:
    """All headlines and their class indices (into HEADLINE_CLASSES), built first if needed."""
    lines = (ensure("headlines", smoke) / HEADLINES_FILE).read_text().splitlines()[1:]
    pairs = [line.split("\t", 1) for line in lines]
    return [text for _, text in pairs], [HEADLINE_CLASSES.index(cls) for cls, _ in pairs]


def headline_splits(
    smoke: bool | None = None, test_fraction: float = 0.2
) -> tuple[tuple[list[str], list[int]], tuple[list[str], list[int]]]:
    """Deterministic ((train_texts, train_labels), (test_texts, test_labels))."""
    texts, labels = load_headlines(smoke)
    order = np.random.default_rng(SPLIT_SEED).permutation(len(texts))
    n_test = round(len(texts) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    return (
        ([texts[i] for i in train], [labels[i] for i in train]),
        ([texts[i] for i in test], [labels[i] for i in test]),
    )


def main(argv: list[str] | None = None) -> None:
    """Build every dataset in both sizes; ``--commit`` rewrites the committed manifests."""
    argv = sys.argv[1:] if argv is None else argv
    for name in SIZES:
        for smoke in (True, False):
            path = write_committed_manifest(name, smoke) if "--commit" in argv else None
            folder = ensure(name, smoke)
            print(f"{folder}: {manifest(name, smoke)['checksum'][:16]}… {path or ''}")


if __name__ == "__main__":
    main()
