"""Lab 02 (NVIDIA DALI): the torchvision reference, the loaders DALI is compared with, the
graders' checks.

DALI is optional: nothing here imports it at module import time. :func:`dali` imports it on
demand (quietly) and raises an ``ImportError`` that says what to do where it is missing
(macOS, Windows, or no wheel for this Python). :func:`available` asks ``ptcourse.core.hardware``.

What is *not* here is the lab's exercise: the DALI pipeline, its loader and the batched
torchvision.io decoder the students write. The checks (:func:`check_dali`, :func:`check_speed`)
take those as arguments and build everything else themselves, from secret draws.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset
from torchvision.transforms import v2

from ptcourse.assets import datasets, loaders
from ptcourse.core import hardware, lineup, measure
from ptcourse.core.quiet import captured_stderr
from ptcourse.core.smoke import pick
from ptcourse.grading import checks, targets
from ptcourse.grading.targets import Target

LAB = lineup.lab("02")

# throughput: images/s of the student's DALI training pipeline (built by the grader with
# sync_pipeline: synchronous executor, num_threads=1, so nothing is prefetched between timed
# calls; build excluded) over Lab 01's PIL loader (per-sample v2 augmentation, num_workers=0),
# per batch, interleaved, 1 thread; full batch 64 x 2 batches, smoke 32 x 1.
# Checks the judge runs outside the student's process: the loaders and tvio_batch are called
# in the worker and their epochs compared with the reference here; the pipeline is built and
# timed in the worker (checks.beside(keep=True), checks.timed(via=run_batches)), the PIL loader
# and the reference pipeline in the trusted twin. The tvio quick test carries its own hidden
# check (check_tvio_visible); the DALI quick test is vouched for by check_dali.
JUDGED = ("tvio_visible", "dali", "speed")
VOUCHED = {"test_dali_visible": "dali"}
SCRIPT = "tools/measure/lab02_dali.py"
MEASURED_ON = (
    "NVIDIA DALI 2.4.0 CPU-only (device_id=None), 2-core AMD EPYC Zen 4 VM (AVX-512, "
    "avx512_bf16), 1 thread, other core loaded"
)
TARGETS: tuple[Target, ...] = (
    # Graded relative to the machine (checks.speed_check): full credit at the floor + 70%
    # of what the reference pipeline (reference_inspection_pipeline) reaches in the same run,
    # never above this target. In the judge, smoke, 2026-12-03 (load average 1.5-3): the
    # reference in the twin 2.08-2.37x (3 runs), the solution notebook in the worker
    # 2.23-2.26x, a baseline copy 1.01x; in one process at the same time the reference took
    # 27.8 ms per batch (CPU time the same), the PIL loader 51 ms: 1.84x. The 3.1-4.3x below
    # were measured under a load average of 9-15. The floor was 1.15x until a clean-clone
    # grading tier (2026-12-04, smoke, a second notebook running on the same 2 cores) gave the
    # baseline copy 1.17x (95% CI 1.14-1.25x), 0.206 of 4 points, beside the reference's 1.84x.
    Target("02", "throughput", "cpu", "speedup", 1.6, 1.3,
           "tools/measure/lab02_dali.py: 5 runs each (fresh secret seed, load average 9-15 "
           "from other sessions on the 2 cores): smoke (32 x 1) 3.10-4.30x, median 3.57; full "
           "(64 x 2) 2.56-3.29x, median 3.06; full marks in 10 of 10; in the judge 1.84-2.37x",
           "Lab 01's PIL work inside DALI (fn.python_function, tests/integration/submissions/"
           "lab02.py), same script and runs: smoke 0.93-1.03x, median 0.98; full 0.88-1.08x, "
           "median 0.97; 0 points in 10 of 10; in the judge up to 1.17x (above)",
           MEASURED_ON, "2026-12-04", SCRIPT),
    Target("02", "throughput", "cuda", "speedup", 2.5, 1.15,
           "NOT measured (no GPU when this lab was written); the claim the lab quotes: "
           "'over 3x' with mixed decoding",
           "PIL loader + copy to the GPU vs itself: expected ~1.0x",
           "NOT measured — DALI mixed (nvJPEG) decode + GPU operators", "2026-12-03", SCRIPT),
    # cpu-basic (no DALI): the speed cell grades tvio_batch's equivalence with the reference.
    Target("02", "tvio_equivalence", "cpu", "score", 1.0, 0.0,
           "tools/measure/lab02_dali.py (PTCOURSE_TRACK=cpu-basic): 1.0 in 5 smoke + 5 full "
           "runs; max |diff| from the reference <= 1e-6 (the same decode and resize calls)",
           "the per-sample PIL reference pasted in: 1.0 in 10 of 10 (a correctness check: the "
           "baseline-equivalent answer is correct); unanswered: raises, 0 points; wrong "
           "normalisation: 0 (tests/unit/labs/test_lab02_dali.py)",
           "2-core AMD EPYC Zen 4 VM (no timing: any machine gives the same)", "2026-12-03",
           SCRIPT),
)  # fmt: skip

INSTALL_HINT = (
    "NVIDIA DALI is not installed or does not import here. It ships Linux wheels only "
    "(x86_64/aarch64): `pip install nvidia-dali-cuda120` (runs CPU-only without a GPU). "
    "On macOS/Windows the lab grades the torchvision.io pipeline instead."
)


@dataclass(frozen=True)
class Sizes:
    """What the notebook measures and the graders use (smoke or full)."""

    batch: int  # images per batch: the notebook's loaders, graded timing, the no-DALI check
    timed_batches: int  # batches per timed call
    budget_s: float  # seconds per ungraded A/B comparison (section 4)
    min_pairs: int  # interleaved pairs per ungraded comparison, at least
    baseline_run_s: float  # min_run_time of the baseline's own timing (section 1)
    loop_files: int  # images in the wall-clock and inference-loop epochs (sections 4 and 5)
    repeats: int  # epochs per wall-clock loader measurement (section 4)
    leak_builds: int  # pipelines built in the thread-leak demonstration (section 3)
    equivalence_files: int  # images of the no-DALI speed check (tvio_batch vs the reference)
    # the hidden correctness check draws a subset of [low, high) images, batches of [low, high)
    subset: tuple[int, int] = (37, 57)
    subset_batch: tuple[int, int] = (8, 17)


def sizes() -> Sizes:
    """The sizes in the current (smoke or full) mode; they do not depend on the track."""
    return Sizes(
        batch=pick(64, 32),
        timed_batches=pick(2, 1),
        budget_s=pick(10.0, 1.5),
        min_pairs=pick(8, 4),
        baseline_run_s=pick(1.0, 0.2),
        loop_files=pick(512, 96),
        repeats=pick(3, 2),
        leak_builds=pick(10, 3),
        equivalence_files=pick(96, 40),
    )


def track() -> hardware.Track:
    return hardware.track_for(LAB)


def runs_dali(here: hardware.Track | None = None) -> bool:
    """True where the DALI exercises run and are graded (not on cpu-basic, DALI imports)."""
    return (here or track()).name != "cpu-basic" and available()


def available() -> bool:
    """True where ``nvidia.dali`` imports (probed once per process, quietly)."""
    return hardware.backend("dali").available


def dali() -> ModuleType:
    """Import ``nvidia.dali`` quietly; ImportError with an install hint where it is missing."""
    if not available():
        raise ImportError(f"{INSTALL_HINT} ({hardware.backend('dali').detail})")
    with captured_stderr():
        import nvidia.dali
        import nvidia.dali.plugin.pytorch  # noqa: F401  (the iterator lives here)
    return nvidia.dali


def eval_transform(spec: loaders.AugmentSpec = loaders.SPEC) -> v2.Compose:
    """The deterministic (inference) preprocessing: resize to size x size, scale, normalise."""
    return v2.Compose(
        [
            v2.ToImage(),
            v2.Resize((spec.size, spec.size), antialias=True),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(spec.mean, spec.std),
        ]
    )


def reference_batch(
    paths: Iterable[str | Path], spec: loaders.AugmentSpec = loaders.SPEC
) -> torch.Tensor:
    """The torchvision reference: PIL decode + :func:`eval_transform`, stacked (N, 3, S, S)."""
    transform = eval_transform(spec)
    return torch.stack([transform(loaders.decode(path)) for path in paths])


def pil_loader(
    files: loaders.Files,
    batch_size: int,
    *,
    train: bool = True,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
    spec: loaders.AugmentSpec = loaders.SPEC,
) -> DataLoader:
    """Lab 01's baseline (PIL, per-sample transforms, 0 workers); eval transform if not train."""
    if train:
        return loaders.baseline_loader(files, batch_size, shuffle=shuffle, generator=generator)
    dataset = loaders.InspectionDataset(files, eval_transform(spec))
    return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, generator=generator)


class TvioDataset(Dataset):
    """Per-sample torchvision.io: read the file, ``decode_jpeg`` (libjpeg-turbo), transform."""

    def __init__(self, files: loaders.Files, transform: Callable[[torch.Tensor], torch.Tensor]):
        self.files = [(str(path), int(label)) for path, label in files]
        self.transform = transform

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from torchvision.io import decode_jpeg, read_file

        path, label = self.files[index]
        return self.transform(decode_jpeg(read_file(path))), label


def tvio_loader(
    files: loaders.Files,
    batch_size: int,
    *,
    train: bool = True,
    num_workers: int = 0,
    shuffle: bool = True,
    spec: loaders.AugmentSpec = loaders.SPEC,
) -> DataLoader:
    """A tuned torchvision loader: torchvision.io decode, tensor transforms, optional workers."""
    transform = loaders.baseline_transform(spec) if train else eval_transform(spec)
    extra: dict[str, Any] = {}
    if num_workers:
        extra = {"persistent_workers": True, "prefetch_factor": 2}
    return DataLoader(
        TvioDataset(files, transform),
        batch_size=batch_size,
        shuffle=shuffle,
        num_workers=num_workers,
        **extra,
    )


def os_threads() -> int:
    """Threads of this process as the OS counts them (DALI's C++ workers included)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:  # no /proc (macOS): Python threads only
        return threading.active_count()


@dataclass(frozen=True)
class Alignment:
    """How an epoch of (x, y) batches compares with the reference, image by image."""

    images: int  # images delivered
    expected: int  # images in the file list
    unique: int  # distinct reference images matched
    label_errors: int  # images whose label is not their file's label
    max_abs_error: float  # largest |x - reference| over all matched images
    mean_abs_error: float  # mean |x - reference|
    batch_sizes: tuple[int, ...]

    @property
    def each_once(self) -> bool:
        return self.images == self.expected == self.unique

    def summary(self) -> str:
        return (
            f"{self.images} images in batches {list(self.batch_sizes)} ({self.unique} distinct "
            f"of {self.expected}); label errors {self.label_errors}; |x - reference| max "
            f"{self.max_abs_error:.3g}, mean {self.mean_abs_error:.3g}"
        )


def require(condition: bool, message: str) -> None:
    """Raise ``checks.CheckFailed`` (an AssertionError) with ``message`` unless ``condition``."""
    if not condition:
        raise checks.CheckFailed(message)


def assert_batch_format(x: Any, y: Any, size: int, device: str = "cpu") -> None:
    """Raise CheckFailed unless x is float32 (b, 3, S, S) and y int64 (b,) on ``device``."""
    require(
        isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor),
        f"each batch must be a pair of tensors (x, y), got {type(x).__name__}, {type(y).__name__}",
    )
    b = len(x)
    require(
        tuple(x.shape) == (b, 3, size, size),
        f"x has shape {tuple(x.shape)}, expected ({b}, 3, {size}, {size}) (NCHW)",
    )
    require(x.dtype == torch.float32, f"x is {x.dtype}, expected torch.float32")
    require(tuple(y.shape) == (b,), f"y has shape {tuple(y.shape)}, expected ({b},) (flatten it)")
    require(y.dtype == torch.int64, f"y is {y.dtype}, expected torch.int64 (.long())")
    require(
        x.device.type == device and y.device.type == device,
        f"batch on {x.device} / {y.device}, expected {device}",
    )


def alignment(
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    files: loaders.Files,
    spec: loaders.AugmentSpec = loaders.SPEC,
    reference: torch.Tensor | None = None,
) -> Alignment:
    """Match every delivered image to its nearest reference image; compare labels and pixels."""
    ref = reference_batch([path for path, _ in files], spec) if reference is None else reference
    labels = torch.tensor([int(label) for _, label in files])
    flat_ref = ref.flatten(1)
    batch_sizes, matched, errors, max_err, abs_sum, count = [], [], 0, 0.0, 0.0, 0
    for x, y in batches:
        x, y = x.detach().float().cpu(), y.detach().cpu().reshape(-1)
        batch_sizes.append(len(x))
        nearest = torch.cdist(x.flatten(1), flat_ref).argmin(dim=1)
        matched += nearest.tolist()
        errors += int((labels[nearest] != y.long()).sum())
        diff = (x - ref[nearest]).abs()
        max_err = max(max_err, float(diff.max())) if len(x) else max_err
        abs_sum += float(diff.sum())
        count += diff.numel()
    return Alignment(
        images=len(matched),
        expected=len(files),
        unique=len(set(matched)),
        label_errors=errors,
        max_abs_error=max_err,
        mean_abs_error=abs_sum / max(count, 1),
        batch_sizes=tuple(batch_sizes),
    )


# Measured between DALI 2.4 (libjpeg-turbo decode, linear resize with antialias, float normalise)
# and the torchvision reference on 240 inspection images: max 0.29, mean 0.0054 (normalised
# units; one grey level is 1/255/std = 0.032). Wrong choices, same images: cubic resize max 0.65,
# mean 0.033; no antialias 1.2 / 0.047; nearest 2.9 / 0.13; ImageNet mean/std 3.1 / 0.21; mean
# and std on the 0..1 scale ~1000.
MAX_ABS_TOLERANCE = 0.5
MEAN_ABS_TOLERANCE = 0.015

SYNC_EXECUTOR = {"exec_async": False, "exec_pipelined": False, "prefetch_queue_depth": 1}


def sync_pipeline(
    graph: Callable[..., Any],
    files: loaders.Files,
    batch_size: int,
    *,
    size: int = loaders.SPEC.size,
    train: bool = True,
    shuffle: bool = True,
    seed: int = 0,
    device_id: int | None = None,
    num_threads: int = 1,
) -> Any:
    """Build ``graph`` (a ``@pipeline_def`` function) to run synchronously, for graded timing.

    Synchronous execution (no async executor, no pipelining, a queue of one) means every
    ``pipe.run()`` does exactly one batch of work inside the call: nothing is computed in the
    background between timed calls. The graph is called as
    ``graph(paths, labels, size, train, shuffle, gpu)``, the exercise's signature.
    """
    dali()
    paths = [str(path) for path, _ in files]
    labels = [int(label) for _, label in files]
    with captured_stderr():
        pipe = graph(
            paths, labels, size, train, shuffle, device_id is not None,
            batch_size=batch_size, num_threads=num_threads, device_id=device_id, seed=seed,
            **SYNC_EXECUTOR,
        )  # fmt: skip
        pipe.build()
    return pipe


def _to_torch(output: Any) -> torch.Tensor:
    """A DALI TensorList (CPU or GPU, uniform shape) as a torch tensor on the same device."""
    from nvidia.dali.plugin.pytorch import feed_ndarray

    if hasattr(output, "as_cpu") and type(output).__name__ == "TensorListGPU":
        tensor = output.as_tensor()
        result = torch.empty(tensor.shape(), dtype=_TORCH_TYPES[str(tensor.dtype)], device="cuda")
        feed_ndarray(tensor, result, cuda_stream=torch.cuda.current_stream())
        return result
    return torch.from_numpy(output.as_array())


_TORCH_TYPES = {"DALIDataType.FLOAT": torch.float32, "DALIDataType.INT32": torch.int32}


def run_batch(pipe: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a built pipeline once: its (images, labels) outputs as torch tensors, labels int64."""
    images, labels = pipe.run()
    return _to_torch(images), _to_torch(labels).reshape(-1).long()


def missing_pipeline_def(graph: Callable[..., Any] | None = None, **_: Any) -> Any:
    """Stand-in for ``nvidia.dali.pipeline_def`` where DALI is missing: calling it explains why."""

    def wrap(function: Callable[..., Any]) -> Callable[..., Any]:
        def unavailable(*args: Any, **kwargs: Any) -> Any:
            raise ImportError(INSTALL_HINT)

        unavailable.__name__ = unavailable.__qualname__ = function.__name__
        unavailable.__doc__ = function.__doc__
        return unavailable

    return wrap(graph) if graph is not None else wrap


def batched_loader(
    files: loaders.Files,
    batch_size: int,
    batch_fn: Callable[[list[str]], torch.Tensor],
    *,
    shuffle: bool = True,
    generator: torch.Generator | None = None,
) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of ``(batch_fn(paths), labels)``: a whole batch of files decoded at once."""
    order = torch.randperm(len(files), generator=generator) if shuffle else torch.arange(len(files))
    for start in range(0, len(files), batch_size):
        chosen = [files[i] for i in order[start : start + batch_size].tolist()]
        labels = torch.tensor([int(label) for _, label in chosen], dtype=torch.int64)
        yield batch_fn([str(path) for path, _ in chosen]), labels


def cycle(make_batches: Callable[[], Iterable[Any]]) -> Iterable[Any]:
    """Endless batches: a new epoch from ``make_batches()`` whenever one ends."""
    while True:
        yield from make_batches()


# ---------------------------------------------------------------------------------------------
# What the graders time and compare


def baseline_epoch(
    files: loaders.Files, batch_size: int, seed: int, count: int, device: str
) -> None:
    """The timed baseline: the first ``count`` training batches of a new epoch of Lab 01's PIL
    loader, shuffled from ``seed``, copied to ``device``."""
    generator = torch.Generator().manual_seed(seed)
    epoch = pil_loader(files, batch_size, train=True, generator=generator)
    for x, y in islice(epoch, count):
        x.to(device, non_blocking=True), y.to(device, non_blocking=True)
    measure.synchronize(device)


def training_pipeline(
    graph: Callable[..., Any],
    files: loaders.Files,
    batch_size: int,
    seed: int,
    device_id: int | None,
) -> Any:
    """:func:`sync_pipeline` of ``graph`` for training: what the speed check times (in the judge
    it is built in the worker, beside the student's graph, and stays there)."""
    return sync_pipeline(graph, files, batch_size, train=True, seed=seed, device_id=device_id)


def run_batches(pipe: Any, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The timed candidate: ``count`` runs of a built (synchronous) DALI pipeline."""
    batches = [run_batch(pipe) for _ in range(count)]
    if batches and batches[0][0].is_cuda:
        torch.cuda.synchronize()
    return batches


def reference_inspection_pipeline(
    paths: list[str], labels: list[int], size: int, train: bool, shuffle: bool, gpu: bool
) -> tuple[Any, Any]:
    """The instructors' exercise B (the solution notebook's graph), undecorated: DALI is
    optional, so :class:`ReferencePipeline` wraps it in ``pipeline_def`` where it builds it."""
    from nvidia.dali import fn, types

    spec = loaders.SPEC
    jpegs, label = fn.readers.file(
        files=paths, labels=labels, random_shuffle=shuffle, name="reader"
    )
    images = fn.decoders.image(jpegs, device="mixed" if gpu else "cpu", output_type=types.RGB)
    if train:
        images = fn.random_resized_crop(
            images, size=[size, size], random_area=list(spec.scale),
            random_aspect_ratio=list(spec.ratio),
        )  # fmt: skip
        images = fn.brightness_contrast(
            images,
            brightness=fn.random.uniform(range=(1 - spec.brightness, 1 + spec.brightness)),
            contrast=fn.random.uniform(range=(1 - spec.contrast, 1 + spec.contrast)),
        )
        mirror = fn.random.coin_flip(probability=spec.flip_p)
    else:
        images = fn.resize(images, size=[size, size])
        mirror = 0
    images = fn.crop_mirror_normalize(
        images, dtype=types.FLOAT, output_layout="CHW", mirror=mirror,
        mean=[255 * m for m in spec.mean], std=[255 * s for s in spec.std],
    )  # fmt: skip
    return images, (label.gpu() if gpu else label)


class ReferencePipeline:
    """The timed reference: ``count`` runs of :func:`reference_inspection_pipeline` built by
    :func:`training_pipeline`. Built on its first call, so that it travels to the judge's
    trusted twin worker as a recipe, once (a built pipeline cannot be pickled)."""

    def __init__(
        self, files: loaders.Files, batch_size: int, seed: int, device_id: int | None
    ) -> None:
        self.recipe = (list(files), batch_size, seed, device_id)
        self.pipe: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"recipe": self.recipe, "pipe": None}

    def __call__(self, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        if self.pipe is None:
            graph = dali().pipeline_def(reference_inspection_pipeline)
            self.pipe = training_pipeline(graph, *self.recipe)
        return run_batches(self.pipe, count)


# ---------------------------------------------------------------------------------------------
# The checks: one per hidden test cell, and the helpers only they use.


def equivalent(result: Alignment) -> bool:
    """True when an epoch matches the reference: each image once, labels, values in tolerance."""
    return (
        result.each_once
        and result.label_errors == 0
        and result.max_abs_error <= MAX_ABS_TOLERANCE
        and result.mean_abs_error <= MEAN_ABS_TOLERANCE
    )


Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]
AUGMENTED = 0.05  # a training epoch's mean |x - nearest reference| above this is augmented


@dataclass(frozen=True)
class Draw:
    """The hidden correctness check's secret draw: a subset of the training images, a batch size
    and a DALI seed; the subset's reference batch; the generator that drew them."""

    files: list[tuple[Path, int]]
    batch: int
    seed: int
    reference: torch.Tensor
    generator: torch.Generator


def secret_draw() -> Draw:
    s = sizes()
    train, _ = datasets.inspection_splits()
    g = checks.secret_generator()
    low, high = s.subset
    n = low + int(torch.randint(0, high - low, (1,), generator=g))
    subset = [train[i] for i in torch.randperm(len(train), generator=g)[:n].tolist()]
    batch = int(torch.randint(*s.subset_batch, (1,), generator=g))
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=g))
    return Draw(subset, batch, seed, reference_batch([path for path, _ in subset]), g)


def require_augmented(training: list[tuple[torch.Tensor, torch.Tensor]], draw: Draw) -> None:
    """A training epoch: every label once, augmented (not the inference images), in range."""
    augmented = alignment(training, draw.files, reference=draw.reference)
    print(
        f"training epoch: {len(training)} batches, mean |x - nearest reference| "
        f"{augmented.mean_abs_error:.3g}"
    )
    labels = sorted(torch.cat([y for _, y in training]).tolist())
    require(
        labels == sorted(label for _, label in draw.files),
        "the training epoch must deliver every image's label once",
    )
    require(
        augmented.mean_abs_error > AUGMENTED,
        "train=True must augment (crop, jitter, flip), not just resize",
    )
    low, high = loaders.SPEC.value_range()
    for x, _ in training:
        inside = bool((x >= low - 1e-3).all() and (x <= high + 1e-3).all())
        require(inside, "training values out of range")


def require_dali_epochs(dali_loader: Callable[..., Batches], draw: Draw) -> None:
    """An inference epoch equal to the reference, labels aligned; an augmented training epoch."""
    with captured_stderr():
        inference = list(
            dali_loader(draw.files, draw.batch, train=False, shuffle=True, seed=draw.seed)
        )
        training = list(
            dali_loader(draw.files, draw.batch, train=True, shuffle=True, seed=draw.seed)
        )
    for x, y in inference + training:
        assert_batch_format(x, y, loaders.SPEC.size)
    result = alignment(inference, draw.files, reference=draw.reference)
    print("inference epoch:", result.summary())
    require(equivalent(result), "the inference epoch does not match the torchvision reference")
    require_augmented(training, draw)


def require_tvio_epoch(tvio_batch: Callable[..., torch.Tensor], draw: Draw) -> None:
    """An epoch of ``tvio_batch`` through :func:`batched_loader` equal to the reference."""
    epoch = batched_loader(draw.files, draw.batch, tvio_batch, generator=draw.generator)
    with captured_stderr():
        result = alignment(epoch, draw.files, reference=draw.reference)
    print("tvio_batch epoch:", result.summary())
    require(equivalent(result), "tvio_batch does not match the torchvision reference")


def check_dali(
    dali_loader: Callable[..., Batches],
    tvio_batch: Callable[..., torch.Tensor],
    *,
    points: float,
) -> float:
    """Exercises B and C on a fresh subset and batch size (all or nothing).

    With DALI: ``dali_loader``'s inference epoch equals the torchvision reference with labels
    aligned; its training epoch is augmented, in range, every label once. Without DALI
    (cpu-basic): an epoch of ``tvio_batch`` equals the reference.
    """
    draw = secret_draw()
    here = track()
    if runs_dali(here):
        require_dali_epochs(dali_loader, draw)
    else:
        print(f"track {here.name}: DALI not used, grading tvio_batch instead")
        require_tvio_epoch(tvio_batch, draw)
    return float(points)


def timed_batches_check(batch: int, count: int, device: str) -> Callable[[tuple, Any], None]:
    """The check of a timed call's output (the first call, then one per block in the judge):
    ``count`` training batches of the lab's format on ``device``, values in the normalised
    range, and no image this check has seen before — every batch is augmented afresh, so a
    pipeline that replays batches it computed earlier repeats them."""
    size = loaders.SPEC.size
    low, high = loaders.SPEC.value_range()
    weights = torch.rand(3 * size * size, generator=torch.Generator().manual_seed(0)).double()
    seen: set[float] = set()

    def verify(args: tuple, batches: Any) -> None:
        require(
            isinstance(batches, list) and len(batches) == count,
            f"a timed call must return {count} batch(es)",
        )
        for pair in batches:
            require(isinstance(pair, tuple | list) and len(pair) == 2, "a batch is a pair (x, y)")
            x, y = pair
            assert_batch_format(x, y, size, device=device)
            require(len(x) == batch, f"training batches of {len(x)} images, expected {batch}")
            x = x.cpu()
            inside = torch.isfinite(x).all() & (x >= low - 1e-3).all() & (x <= high + 1e-3).all()
            require(bool(inside), "training values out of range")
            prints = (x.flatten(1).double() @ weights).tolist()  # one number per image
            require(
                len(set(prints)) == len(prints) and seen.isdisjoint(prints),
                "the timed pipeline delivered images it had delivered before: training batches "
                "must be augmented afresh",
            )
            seen.update(prints)

    return verify


PYTHON_OPERATORS = ("Python", "ExternalSource", "Numba")  # run Python (or take data from it)


def pipeline_operators(pipe: Any) -> list[str]:
    """The operators of a built pipeline by schema name (``readers__File``, ``decoders__Image``,
    ``RandomResizedCrop``…), read where it was built (in the judge: the worker's word)."""
    specs = [str(op.spec) for op in getattr(pipe, "_ops", None) or []]
    return [spec.split(":", 1)[0].removeprefix("OpSpec for ").strip() for spec in specs]


def _seeded(
    seeds: torch.Generator, *before: Any, after: tuple[Any, ...] = ()
) -> Callable[[], tuple[Any, ...]]:
    """Arguments of one timed call: ``before``, a new seed at every call, ``after``."""
    return lambda: (*before, int(torch.randint(2**62, (1,), generator=seeds)), *after)


def grade_throughput(
    inspection_pipeline: Callable[..., Any], here: hardware.Track, points: float
) -> float:
    """Images/s of the training pipeline, built synchronously at one thread (in the judge: in
    the worker, and run there), over Lab 01's PIL loader, relative to what the reference
    pipeline (:class:`ReferencePipeline`) reaches in the same run; the first timed output and
    one per block checked (:func:`timed_batches_check`). Where the reference does not clear the
    floor, DALI's operators in effect are graded (no Python in the graph)."""
    s = sizes()
    files, _ = datasets.inspection_splits()
    device_id = 0 if here.name == "cuda" else None
    secret = checks.secret_generator()
    seed = int(torch.randint(2**31, (1,), generator=secret))
    with captured_stderr():
        pipe = checks.beside(
            inspection_pipeline, training_pipeline, files, s.batch, seed, device_id, keep=True
        )

    def dali_operators_only(reason: str) -> float:
        ops = checks.beside(pipe, pipeline_operators)
        python = [op for op in ops if any(word in op for word in PYTHON_OPERATORS)]
        if python or not any(op.startswith("decoders__") for op in ops):
            raise checks.CheckFailed(f"{reason}; and the graph is not DALI operators only: {ops}")
        print(f"graded instead: DALI decodes and augments ({', '.join(ops)})")
        return float(points)

    return checks.speed_check(
        targets.goal(TARGETS, "throughput"),
        pipe,
        fresh=lambda: (s.timed_batches,),
        verify=timed_batches_check(s.batch, s.timed_batches, here.device),
        via=run_batches,
        baseline=baseline_epoch,
        baseline_inputs=_seeded(secret, files, s.batch, after=(s.timed_batches, here.device)),
        reference=ReferencePipeline(files, s.batch, seed, device_id),
        points=points,
        not_gradable=dali_operators_only,
    )


def grade_tvio_equivalence(tvio_batch: Callable[..., torch.Tensor], points: float) -> float:
    """Without DALI: ``tvio_batch`` over a fresh subset equals the reference (1.0) or not (0)."""
    s = sizes()
    files, _ = datasets.inspection_splits()
    g = checks.secret_generator()
    order = torch.randperm(len(files), generator=g)[: s.equivalence_files].tolist()
    subset = [files[i] for i in order]

    def equivalence() -> float:
        result = alignment(batched_loader(subset, s.batch, tvio_batch, generator=g), subset)
        print("tvio_batch epoch:", result.summary())
        return float(equivalent(result))

    return checks.value(targets.goal(TARGETS, "tvio_equivalence"), equivalence, points=points)


def check_tvio_visible(tvio_batch: Callable[..., torch.Tensor], *, points: float) -> float:
    """Exercise A on every track (the quick test's point, through the judge): an epoch of
    ``tvio_batch`` over a fresh subset and batch size equals the torchvision reference."""
    require_tvio_epoch(tvio_batch, secret_draw())
    return float(points)


def check_speed(
    inspection_pipeline: Callable[..., Any],
    tvio_batch: Callable[..., torch.Tensor],
    *,
    points: float,
) -> float:
    """With DALI: the training pipeline's speedup over Lab 01's PIL loader, per batch,
    interleaved, one thread, graded against the ``throughput`` row. Without DALI (cpu-basic):
    ``tvio_batch``'s equivalence with the reference on a fresh subset."""
    here = track()
    if runs_dali(here):
        return grade_throughput(inspection_pipeline, here, points)
    return grade_tvio_equivalence(tvio_batch, points)
