import pytest
import torch
import torch.nn.functional as F
from rss_probe import run_pinned

from ptcourse.assets import models, text
from ptcourse.core import measure
from ptcourse.grading import checks
from ptcourse.labs import lab06_attention as attention


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


def _sdpa(q, k, v, mask=None):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def test_problem_sizes_and_smoke(monkeypatch):
    p = attention.Problem(2, 3, 128, 16)
    assert p.shape == (2, 3, 128, 16)
    assert p.score_bytes() == 2 * 3 * 128 * 128 * 4
    assert p.score_bytes(torch.bfloat16) == p.score_bytes() // 2
    assert p.flops == 4 * 2 * 3 * 128 * 128 * 16
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = attention.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = attention.sizes()
    assert full.speed.length >= 1024 and smoke.speed.length >= 1024  # the graded speed length
    assert full.memory.length > smoke.memory.length


def test_padding_mask_keeps_at_least_one_key_per_row():
    mask = attention.key_padding_mask(64, 5, generator=torch.Generator().manual_seed(0))
    assert mask.shape == (64, 1, 1, 5) and mask.dtype == torch.bool
    assert mask[..., 0].all() and (~mask).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_and_naive_match_the_reference_within_tolerance(dtype):
    g = torch.Generator().manual_seed(0)
    problem = attention.Problem(2, 2, 64, 32)
    q, k, v = attention.qkv(problem, dtype=dtype, generator=g)
    mask = attention.key_padding_mask(2, 64, generator=g)
    atol, rtol = attention.TOLERANCE[dtype]
    for m in (None, mask):
        want = attention.reference(q, k, v, m)
        assert want.dtype == dtype
        for fn in (_sdpa, models.naive_attention):
            assert torch.allclose(fn(q, k, v, m).float(), want.float(), atol=atol, rtol=rtol)
    wrong = models.naive_attention(q, k, v * 1.1)  # a plainly wrong answer fails the tolerance
    assert not torch.allclose(wrong.float(), want.float(), atol=atol, rtol=rtol)


def test_trace_names_the_fused_kernel_and_sees_the_score_matrix():
    problem = attention.Problem(1, 2, 256, 32)
    q, k, v = attention.qkv(problem)
    naive = attention.trace(models.naive_attention, q, k, v)
    assert naive.fused_kernels == ()
    assert naive.largest_bytes == problem.score_bytes()
    fused = attention.trace(_sdpa, q, k, v)
    assert fused.fused_kernels == ("_scaled_dot_product_flash_attention_for_cpu",)
    assert fused.largest_bytes <= q.numel() * 4
    masked = attention.trace(_sdpa, q, k, v, attention.key_padding_mask(1, 256))
    assert masked.fused_kernels  # a boolean padding mask keeps the fused kernel
    assert "flash" in fused.summary()


def test_sweep_skips_the_naive_attention_past_its_limit():
    result = attention.sweep(
        {"naive": models.naive_attention, "sdpa": _sdpa},
        (32, 128),
        heads=1,
        dim=16,
        min_run_time=0.01,
        max_score_mb={"naive": 0.01},
    )
    assert result.lengths == (32, 128)
    assert result.ms["naive"][1] is None and result.mb["naive"][1] is None
    assert all(t is not None and t > 0 for t in result.ms["sdpa"])
    assert result.ms["naive"][0] > 0


def test_use_attention_plugs_a_function_into_the_text_classifier():
    torch.manual_seed(0)
    model = models.TextClassifier(vocab_size=50, num_classes=3, max_len=16).eval()
    tokens = text.random_tokens(4, 16, 50, generator=torch.Generator().manual_seed(0))
    assert (tokens == 0).any() and (tokens[:, :8] != 0).all()
    with torch.no_grad():
        want = model(tokens)
        calls = []

        def spy(q, k, v, mask=None):
            calls.append(mask.shape)
            return models.naive_attention(q, k, v, mask)

        attention.use_attention(model, spy)
        got = model(tokens)
    assert model.attention == "function" and len(calls) == len(model.layers)
    assert calls[0] == (4, 1, 1, 16)
    assert torch.allclose(got, want, atol=1e-5)


def test_backend_table_runs_math_and_flash_on_cpu_and_explains_the_rest():
    rows = attention.backend_table(
        "cpu", (32, 64), batch=1, heads=1, dim=16, dtype=torch.float32,
        min_run_time=0.01, max_score_mb=0.01,
    )  # fmt: skip
    ran = {(r.backend, r.length) for r in rows if r.ms is not None}
    assert {("naive", 32), ("sdpa math", 32), ("sdpa flash", 64)} <= ran
    skipped = {r.backend: r.note for r in rows if r.ms is None and r.length == 64}
    assert skipped["naive"].startswith("score matrix over") and "sdpa math" in skipped
    assert skipped["sdpa memory-efficient"] and skipped["sdpa cuDNN"]
    assert all("not run" in r.summary() for r in rows if r.ms is None)


RSS_PROBE = """
import json
import torch
import torch.nn.functional as F
from ptcourse.assets import models
from ptcourse.core import measure
from ptcourse.labs import lab06_attention as attention
pinned = measure.rss_follows_tensors()
torch.set_num_threads(1)
problem = attention.Problem(1, 4, 1024, 64)
q, k, v = attention.qkv(problem)
naive = lambda: models.naive_attention(q, k, v)
sdpa = lambda: F.scaled_dot_product_attention(q, k, v)
naive(), sdpa()
peaks = {"naive": [], "sdpa": []}
for name in ("naive", "sdpa", "sdpa", "naive", "naive", "sdpa"):
    fn = naive if name == "naive" else sdpa
    peaks[name].append(measure.peak_memory(fn).peak_bytes)
print(json.dumps({"pinned": pinned, "peaks": peaks, "matrix": problem.score_bytes()}))
"""


def test_pinned_rss_reads_two_score_matrices_for_naive_and_little_for_sdpa():
    result = run_pinned(RSS_PROBE)
    matrix = result["matrix"]
    for peak in result["peaks"]["naive"]:  # the (L, L) scores and their softmax, alive together
        assert 1.9 * matrix < peak < 2.3 * matrix, result
    for peak in result["peaks"]["sdpa"]:  # its output (1/16 of a matrix) and a few tiles
        assert peak < 0.2 * matrix, result


# ---------------------------------------------------------------------------------------------
# The graders' checks: a right answer earns full points, a wrong or baseline-equivalent one 0.


@pytest.fixture
def graded(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", "1234")


def _wrong(q, k, v, mask=None):
    """Fused, but a plainly wrong answer (values scaled)."""
    return F.scaled_dot_product_attention(q, k, v * 1.1, attn_mask=mask)


def _unmasked_naive(q, k, v, mask=None):
    return models.naive_attention(q, k, v)


def test_check_naive_wants_right_values_and_no_fused_kernel(graded, capsys):
    assert attention.check_naive(models.naive_attention, points=2) == 2.0
    assert "all 5 cases" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="makes the L x L scores"):
        attention.check_naive(attention.reference_sdpa, points=2)
    with pytest.raises(checks.CheckFailed, match="max abs difference"):
        attention.check_naive(_unmasked_naive, points=2)


def test_check_sdpa_wants_right_values_through_a_fused_kernel(graded):
    assert attention.check_sdpa(attention.reference_sdpa, points=2) == 2.0
    with pytest.raises(checks.CheckFailed, match="a fused kernel keeps under"):
        attention.check_sdpa(attention.baseline_attention, points=2)  # the naive one pasted
    with pytest.raises(checks.CheckFailed, match="max abs difference"):
        attention.check_sdpa(_wrong, points=2)


def test_check_speed_full_points_for_sdpa_and_zero_for_the_baseline(graded):
    # one retry: a stall of the shared machine once cost the reference a run (1.5x, 0.7/3)
    earned = attention.check_speed(attention.reference_sdpa, points=3)
    if earned < 3.0:
        earned = attention.check_speed(attention.reference_sdpa, points=3)
    assert earned == 3.0
    with pytest.raises(checks.CheckFailed):
        attention.check_speed(attention.baseline_attention, points=3)
    assert checks.RESULTS[-1].points == 0 and checks.RESULTS[-1].value < 1.3
    with pytest.raises(checks.CheckFailed, match="max abs difference"):
        attention.check_speed(_wrong, points=3)  # checked before it is timed


MEMORY_PROBE = """
import json
import os

import torch

os.environ["PTCOURSE_SMOKE"] = "1"
os.environ["PTCOURSE_SECRET_SEED"] = "1234"
from ptcourse.assets import models
from ptcourse.core import measure
from ptcourse.grading import checks
from ptcourse.labs import lab06_attention as attention

pinned = measure.rss_follows_tensors()
torch.set_num_threads(1)


def chunked(q, k, v, mask=None):  # naive attention over 8 blocks of queries: 1/8 of the scores
    return torch.cat([models.naive_attention(c, k, v, mask) for c in q.chunk(8, dim=2)], dim=2)


def points(answer):
    try:
        return attention.check_memory(answer, points=3)
    except checks.CheckFailed:
        return checks.RESULTS[-1].points


answers = {"right": attention.reference_sdpa, "baseline": attention.baseline_attention,
           "chunked": chunked}
result = {name: points(fn) for name, fn in answers.items()}
print(json.dumps({"pinned": pinned, "points": result, "ratios": [r.value for r in checks.RESULTS]}))
"""


def test_check_memory_full_points_for_sdpa_partial_for_chunks_zero_for_the_baseline():
    result = run_pinned(MEMORY_PROBE)
    points = result["points"]
    assert points["right"] == 3.0, result
    assert points["baseline"] == 0, result
    assert 0 < points["chunked"] < 3, result


# Exercise 2, the online softmax by hand: the reference, and what a student might hand in instead.


def _naive_as_blockwise(q, k, v, mask=None, block_size=128):
    return models.naive_attention(q, k, v, mask)


def _sdpa_as_blockwise(q, k, v, mask=None, block_size=128):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _softmax_per_block(q, k, v, mask=None, block_size=128):
    """Each block's own softmax, averaged: no running maximum or rescaling (wrong values)."""
    outs = []
    for start in range(0, k.shape[-2], block_size):
        part = None if mask is None else mask[..., start : start + block_size]
        kb, vb = k[..., start : start + block_size, :], v[..., start : start + block_size, :]
        outs.append(torch.nan_to_num(models.naive_attention(q, kb, vb, part)))
    return torch.stack(outs).mean(dim=0)


def test_check_blockwise_passes_the_reference_and_fails_the_shortcuts(graded, capsys):
    assert attention.check_blockwise(attention.reference_blockwise, points=3) == 3.0
    assert "all 6 cases" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed, match="quarter or more of the"):
        attention.check_blockwise(_naive_as_blockwise, points=3)
    with pytest.raises(checks.CheckFailed, match="write the loop yourself"):
        attention.check_blockwise(_sdpa_as_blockwise, points=3)
    with pytest.raises(checks.CheckFailed, match="max abs error"):
        attention.check_blockwise(_softmax_per_block, points=3)


def test_blockwise_reference_is_exact_where_a_block_starts_fully_masked():
    """Rows whose first keys are all padding (m still -inf): no NaN, the reference's values."""
    problem = attention.Problem(1, 1, 40, 8)
    q, k, v = attention.qkv(problem, generator=torch.Generator().manual_seed(0))
    mask = torch.zeros(1, 1, 1, 40, dtype=torch.bool)
    mask[..., 25:] = True  # only keys 25..39 may be attended: blocks 0-2 of 8 are all masked
    out = attention.reference_blockwise(q, k, v, mask, block_size=8)
    assert torch.allclose(out, attention.reference(q, k, v, mask), atol=1e-5, rtol=1e-4)


BLOCKWISE_MEMORY_PROBE = """
import json
import os

import torch

os.environ["PTCOURSE_SMOKE"] = "1"
os.environ["PTCOURSE_SECRET_SEED"] = "1234"
from ptcourse.core import measure
from ptcourse.grading import checks
from ptcourse.labs import lab06_attention as attention

pinned = measure.rss_follows_tensors()
torch.set_num_threads(1)


def points(answer):
    try:
        return attention.check_blockwise_memory(answer, points=3)
    except checks.CheckFailed:
        return checks.RESULTS[-1].points


answers = {"right": attention.reference_blockwise, "baseline": attention.baseline_attention}
result = {name: points(fn) for name, fn in answers.items()}
print(json.dumps({"pinned": pinned, "points": result, "ratios": [r.value for r in checks.RESULTS]}))
"""


def test_check_blockwise_memory_full_points_for_the_reference_zero_for_the_baseline():
    result = run_pinned(BLOCKWISE_MEMORY_PROBE)
    assert result["points"] == {"right": 3.0, "baseline": 0}, result
