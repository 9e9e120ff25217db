import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from ptcourse.core import measure
from ptcourse.grading import checks
from ptcourse.labs import lab09_profiling as profiling

SMALL = profiling.Sizes(rows=4096, dim=16, batch=16, length=12)


@pytest.fixture(autouse=True)
def one_thread():
    with measure.pinned_threads(1):
        yield


def test_the_fix_exercises_answer_is_not_importable_under_a_public_name():
    public = {n for n in dir(profiling) if not n.startswith("_")}
    assert "hash_features" not in public and "hash_features_loop" in public


def test_vectorised_hashing_gives_the_loops_features():
    tokens, _ = profiling.batch(SMALL, seed=0)
    tokens[0, 5:] = 0  # a short headline
    slow = profiling.hash_features_loop(tokens, SMALL.rows)
    fast = profiling._hash_features(tokens, SMALL.rows)
    assert slow.shape == fast.shape == (SMALL.batch, 2 * SMALL.length - 1)
    for a, b in zip(slow, fast, strict=True):
        assert torch.equal(a[a != 0].sort().values, b[b != 0].sort().values)
    assert int(slow.max()) < SMALL.rows and int(slow[slow != 0].min()) >= 1


def test_fixed_step_trains_like_the_slow_step_and_wrong_fixes_do_not():
    ok = profiling.same_training(
        profiling.reference_setup, profiling.reference_step, seed=3, size=SMALL
    )
    assert ok.ok and ok.embedding_sparse, ok.summary()
    same = profiling.same_training(
        profiling.baseline_setup, profiling.baseline_step, seed=3, size=SMALL
    )
    assert same.ok and same.grad_error == 0

    def adam(model, lr):
        return torch.optim.Adam(model.parameters(), lr=lr)

    def summed(model, opt, tokens, labels):
        ids = profiling._hash_features(tokens, model.embedding.num_embeddings)
        loss = F.cross_entropy(model(ids), labels, reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item() / len(labels)

    def unigrams_only(model, opt, tokens, labels):
        rows = model.embedding.num_embeddings
        loss = F.cross_entropy(model(torch.where(tokens != 0, tokens % (rows - 1) + 1, 0)), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    for setup, step in [
        (adam, profiling.reference_step),
        (profiling.reference_setup, summed),
        (profiling.reference_setup, unigrams_only),
    ]:
        result = profiling.same_training(setup, step, seed=3, size=SMALL)
        assert not result.ok, result.summary()


def test_profile_is_quiet_and_names_the_slow_steps_parts(tmp_path, capfd):
    run = profiling.trainer(profiling.baseline_setup, profiling.baseline_step, SMALL, seed=0)
    trace = tmp_path / "trace.json"
    prof = profiling.profile_steps(run, trace_path=trace)
    assert capfd.readouterr().err == ""
    found = profiling.diagnosis(prof)
    assert found.op_share(found.top_op) == 1.0
    assert found.op_share("not an op") == 0.0 and found.op_share(None) == 0.0
    assert found.op_share(found.top_op.removeprefix("aten::")) == 1.0
    assert set(found.stage_ms) == set(profiling.STAGES) and all(found.stage_ms.values())
    assert found.shape_and_stage(found.top_shapes[found.top_op], found.top_stage) == 1.0
    assert found.shape_and_stage((1, 2), "nowhere") == 0.0
    assert found.shape_and_stage("nonsense", found.top_stage) == 0.5
    spans = profiling.trace_spans(trace)
    assert [s.name for s in spans] == list(profiling.STAGES)
    features = spans[0]
    assert features.outside_ops_ms > features.in_ops_ms  # the Python loop
    assert json.loads(trace.read_text())["traceEvents"]
    assert profiling.step_wall_ms(prof) > 0


def test_allocations_name_the_dense_gradient_and_its_real_callers():
    from torch._C._profiler import _ExperimentalConfig
    from torch.profiler import ProfilerActivity, profile

    run = profiling.trainer(profiling.baseline_setup, profiling.baseline_step, SMALL, seed=0)
    run()
    config = _ExperimentalConfig(verbose=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, with_stack=True,
                 experimental_config=config) as prof:  # fmt: skip
        run()
    top = profiling.allocations(prof, n=2)[0]
    assert top.mb == pytest.approx(SMALL.rows * SMALL.dim * 4 / 2**20, rel=0.05), top
    assert top.stage == "backward" and "aten::embedding_dense_backward" in top.callers, top


def test_dense_table_gradient_dominates_the_slow_step_at_lab_size():
    size = profiling.sizes()
    found = profiling.diagnose(seed=1, size=size)
    assert found.top_shapes[found.top_op] == (size.rows, size.dim), found.summary()
    assert found.top_stage == "backward", found.summary()


SHARES = {"features": 0.015, "forward": 0.02, "loss": 0.028, "backward": 0.81, "optimizer": 0.125}


def test_blame_score_stage_by_stage():
    right = {"backward": 0.81, "optimizer": 0.13}
    assert profiling.blame_score(SHARES, right) == 1.0
    assert profiling.blame_score(SHARES, {"backward": 0.75, "optimizer": 0.2}) == 1.0  # within 0.1
    assert profiling.blame_score(SHARES, {"backward": 0.81}) == 0.8  # optimizer missed
    assert profiling.blame_score(SHARES, {"backward": 0.5, "optimizer": 0.13}) == 0.8  # far off
    assert profiling.blame_score(SHARES, {}) == 0.6  # blank: only the small stages right
    code_reader = {"features": 0.015, "loss": 0.028}  # the Python loops look slow
    assert profiling.blame_score(SHARES, code_reader) == 0.2
    everything = dict(SHARES)  # blame every stage, with exact shares
    assert profiling.blame_score(SHARES, everything) == 0.4
    in_band = {**SHARES, "loss": 0.06}  # between 4% and 8%: either answer counts
    assert profiling.blame_score(in_band, right) == 1.0
    assert profiling.blame_score(in_band, {**right, "loss": 0.06}) == 1.0
    for junk in (None, "backward", [("backward", 0.8)], {"backward": "0.8"},
                 {"backward": 81.0, "optimizer": 0.13}, {"step": 0.9}, {"backward": math.nan},
                 {("backward",): 0.8}):  # fmt: skip
        assert profiling.blame_score(SHARES, junk) == 0.0, junk
    verdict = profiling.blame_verdict(SHARES, {"backward": 0.81})
    assert "optimizer" in verdict and "wrong" in verdict and verdict.count("right") == 4


def test_check_suspects_against_the_graders_own_profile(graded, capsys):
    found = profiling.diagnose(checks.secret_seed())
    right = {k: v for k, v in found.stage_shares.items() if v >= profiling.BLAME_SHARE}
    assert set(right) == {"backward", "optimizer"}, found.stage_shares
    assert profiling.check_suspects(right, points=3) == 3.0
    assert "backward" in capsys.readouterr().out
    assert profiling.check_suspects({"backward": right["backward"]}, points=3) == 1.5
    for wrong in ({"features": 0.02, "loss": 0.03}, {}, dict(found.stage_shares), {"x": 1.0}):
        with pytest.raises(checks.CheckFailed):
            profiling.check_suspects(wrong, points=3)


def test_embedding_updates_dense_sparse_and_adam():
    ids = torch.randint(1, 512, (8, 10))
    for sparse, opt in [(False, "sgd"), (True, "sgd"), (False, "adam"), (True, "sparse_adam")]:
        profiling.embedding_update(512, 8, ids, sparse, opt)()
    with pytest.raises(RuntimeError, match="sparse"):
        profiling.embedding_update(512, 8, ids, True, "adam")()


def test_gpu_busy_sums_device_events_by_kind():
    cuda, cpu = torch.autograd.DeviceType.CUDA, torch.autograd.DeviceType.CPU

    def event(name, us, device=cuda, annotation=False):
        span = SimpleNamespace(elapsed_us=lambda: us)
        return SimpleNamespace(
            name=name, device_type=device, time_range=span, is_user_annotation=annotation
        )

    prof = SimpleNamespace(
        events=lambda: [
            event("void gemm_kernel", 6000),
            event("Memcpy HtoD (Pageable -> Device)", 500),
            event("Memcpy DtoH (Device -> Pageable)", 250),
            event("Memset (Device)", 250),
            event("cudaLaunchKernel", 9000, cpu),
            event("ProfilerStep#2", 9000, annotation=True),
        ]
    )
    busy = profiling.gpu_busy(prof, wall_ms=10.0)
    assert busy.kernel_ms == 6.0 and busy.h2d_ms == 0.5 and busy.d2h_ms == 0.25
    assert busy.utilisation == pytest.approx(0.6)
    assert busy.copy_share == pytest.approx(1.0 / 7.0)
    assert "60%" in busy.summary()


# ---------------------------------------------------------------------------------------------
# The graders' checks: a right answer earns full points, a wrong or baseline-equivalent one 0.


@pytest.fixture
def graded(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", "1234")


def _adam(model, lr):  # trains differently from the slow step's plain SGD
    return torch.optim.Adam(model.parameters(), lr=lr)


def test_check_diagnosis_full_partial_and_no_credit(graded):
    table = (profiling.sizes().rows, profiling.sizes().dim)
    assert profiling.check_diagnosis("aten::fill_", table, "backward", points=3) == 3.0
    assert profiling.check_diagnosis("fill_", (1, 2), "forward", points=3) == 2.0
    with pytest.raises(checks.CheckFailed, match="no part of the diagnosis"):
        profiling.check_diagnosis("aten::not_an_op", (1, 2), "forward", points=3)


def test_check_fix_correct_wants_the_slow_steps_training(graded, capsys, monkeypatch):
    monkeypatch.setattr(profiling, "sizes", lambda: SMALL)  # correctness does not need the size
    fix = (profiling.reference_setup, profiling.reference_step)
    assert profiling.check_fix_correct(*fix, points=2) == 2.0
    assert "sparse embedding gradient: True" in capsys.readouterr().out
    slow = (profiling.baseline_setup, profiling.baseline_step)
    assert profiling.check_fix_correct(*slow, points=2) == 2.0  # slow but right
    with pytest.raises(checks.CheckFailed, match="not the slow step's training"):
        profiling.check_fix_correct(_adam, profiling.reference_step, points=2)


def test_check_fix_speed_full_points_for_the_fix_and_zero_for_the_slow_step(graded):
    assert (
        profiling.check_fix_speed(profiling.reference_setup, profiling.reference_step, points=3)
        == 3.0
    )
    with pytest.raises(checks.CheckFailed):
        profiling.check_fix_speed(profiling.baseline_setup, profiling.baseline_step, points=3)
    assert checks.RESULTS[-1].points == 0 and checks.RESULTS[-1].value < 3.0
    with pytest.raises(checks.CheckFailed, match="must train like the slow one"):
        profiling.check_fix_speed(_adam, profiling.reference_step, points=3)
