"""Lab 01 (data loading): a baseline-equivalent submission.

"baseline" pastes the baseline into every exercise: the cache is built (the baseline has none, so
any correct cache will do), augmentation runs one sample at a time with ``baseline_transform``, and
the "cached" pipeline ignores the cache and iterates the baseline loader over the JPEGs. It must
score 0 on the speed check. No looper: a looping exercise would also time out the ungraded
measurement cells of section 4 (several minutes of grading for one submission).
"""

PER_SAMPLE_AUGMENT = '''
def augment_batch(images, generator, spec=loaders.SPEC):
    """Baseline-equivalent: the per-sample transform, one image at a time."""
    transform = loaders.baseline_transform(spec)
    return torch.stack([transform(image) for image in images])
'''

BASELINE_LOADER = '''
def cached_batches(images, labels, batch_size, generator, device="cpu"):
    """Baseline-equivalent: the baseline DataLoader over the JPEG files."""
    yield from loaders.baseline_loader(FILES, batch_size)
'''

VARIANT = {
    "students": {
        "baseline": {"augment_batch": PER_SAMPLE_AUGMENT, "cached_batches": BASELINE_LOADER},
    },
    "speed_checks": ["test_speed"],
    "loop_checks": [],
}
