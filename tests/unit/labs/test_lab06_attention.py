import pytest
import torch
import torch.nn.functional as F
from rss_probe import run_pinned

from ptcourse.assets import models
from ptcourse.core import measure
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
    full = (attention.speed_problem(), attention.memory_problem())
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = (attention.speed_problem(), attention.memory_problem())
    assert full[0].length >= 1024 and smoke[0].length >= 1024  # the graded speed length
    assert full[1].length > smoke[1].length


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
    tokens = attention.random_tokens(4, 16, 50, generator=torch.Generator().manual_seed(0))
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
