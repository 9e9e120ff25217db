"""Lab 01 (data loading): targets; the graders move here from the notebook."""

from __future__ import annotations

from ptcourse.grading.targets import CPU_VM, Target

# Lab 01: images/s of the student's cached + batched pipeline over the baseline loader (PIL decode
# + per-sample v2 augmentation, num_workers=0), interleaved, 1 thread, cache build excluded; full:
# batch 64, 2 batches per call, 1920 training images; smoke: batch 32, 1 batch, 256 images.
# Measured 2026-12-02 with one busy neighbour process, and again under other sessions' load
# (load average 5-10 on 2 cores); smoke and full give the same ratios, so one threshold serves.
TARGETS: tuple[Target, ...] = (
    Target("01", "throughput", "cpu", "speedup", 2.5, 1.3,
           "reference (hidden-test code in the notebook): 3.16-4.18x in 10 full papermill runs, "
           "4.23-5.72x in 10 smoke autogrades (10/10 full marks); as a script 4.21-4.67x full, "
           "4.30-5.79x smoke (10 each); with images[idx] instead of index_select 3.07-5.20x "
           "(64 runs, incl. heavy load). Cache only, per-sample augmentation: 1.40-2.19x (63 runs, "
           "partial credit); a first-try batched version (float before crop, torch.where flips) "
           "0.80-2.53x",
           "baseline loader vs itself 0.90-1.16x (63 runs)",
           f"{CPU_VM}; interleaved pairs, measure.compare", "2026-12-02"),
)  # fmt: skip
