import pytest
import torch
import torch.nn.functional as F
from rss_probe import run_pinned

from ptcourse.core import measure, numerics, seeds
from ptcourse.grading import checks
from ptcourse.labs import lab04_grad_accumulation as accumulation

SEED = "1234"


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: a second OpenMP thread only stalls on a shared 2-core machine."""
    with measure.pinned_threads(1):
        yield


def _accumulate(model, loss_fn, x, y, accum_steps, scaler=None):
    """A correct accumulated step (the lab's exercise), for testing the helpers."""
    total = 0.0
    for xb, yb in zip(x.tensor_split(accum_steps), y.tensor_split(accum_steps), strict=True):
        if len(xb) == 0:
            continue
        with torch.autocast(x.device.type, enabled=scaler is not None):
            loss = loss_fn(model(xb), yb) * (len(xb) / len(x))
        (scaler.scale(loss) if scaler is not None else loss).backward()
        total += loss.item()
    return total


def _summed_not_scaled(model, loss_fn, x, y, accum_steps, scaler=None):
    """The classic bug: the micro-batch losses are not divided by accum_steps."""
    for xb, yb in zip(x.chunk(accum_steps), y.chunk(accum_steps), strict=True):
        loss_fn(model(xb), yb).backward()
    return 0.0


def _divided_by_k(model, loss_fn, x, y, accum_steps, scaler=None):
    """Right for equal micro-batches only: every micro-batch mean divided by accum_steps."""
    total = 0.0
    for xb, yb in zip(x.tensor_split(accum_steps), y.tensor_split(accum_steps), strict=True):
        loss = loss_fn(model(xb), yb) / accum_steps
        loss.backward()
        total += loss.item()
    return total


def _one_big_batch(model, loss_fn, x, y, accum_steps, scaler=None):
    """The baseline-equivalent submission: one forward and backward, accum_steps ignored."""
    return accumulation.baseline_step(model, loss_fn, x, y)


def _steps_the_weights(model, loss_fn, x, y, accum_steps, scaler=None):
    """Right gradients, then an SGD step of its own."""
    loss = _accumulate(model, loss_fn, x, y, accum_steps, scaler)
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    return loss


@pytest.fixture
def graded(monkeypatch):
    """Smoke sizes, a fixed secret seed, the CPU track."""
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", SEED)
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu")


def test_conv_net_has_batchnorm_only_when_asked():
    plain = accumulation.conv_net(channels=4)
    with_bn = accumulation.conv_net(channels=4, batchnorm=True)
    assert not any(isinstance(m, torch.nn.BatchNorm2d) for m in plain.modules())
    assert sum(isinstance(m, torch.nn.BatchNorm2d) for m in with_bn.modules()) == 5
    assert plain(torch.randn(2, 3, 16, 16)).shape == (2, 4)
    assert with_bn(torch.randn(2, 3, 16, 16)).shape == (2, 4)


def test_accumulated_gradients_match_the_full_batch_and_bugs_do_not():
    model = seeds.seeded(lambda: accumulation.conv_net(4), 0)
    x, y = accumulation.images(10, 12, generator=torch.Generator().manual_seed(0))
    full, full_loss = accumulation.grads_after(
        accumulation.baseline_step, model, F.cross_entropy, x, y
    )
    got, loss = accumulation.grads_after(_accumulate, model, F.cross_entropy, x, y, 4)
    assert numerics.max_abs_error(got, full) < 1e-5
    assert abs(loss - full_loss) < 1e-5
    wrong, _ = accumulation.grads_after(_summed_not_scaled, model, F.cross_entropy, x, y, 2)
    assert numerics.relative_error(wrong, full) > 0.5


def test_batchnorm_breaks_the_equivalence():
    model = seeds.seeded(lambda: accumulation.conv_net(4, batchnorm=True), 0)
    x, y = accumulation.images(16, 12, generator=torch.Generator().manual_seed(0))
    full, _ = accumulation.grads_after(accumulation.baseline_step, model, F.cross_entropy, x, y)
    got, _ = accumulation.grads_after(_accumulate, model, F.cross_entropy, x, y, 4)
    assert numerics.relative_error(got, full) > 1e-3


def test_amp_check_passes_a_correct_step_and_catches_missing_autocast():
    good = accumulation.amp_check(_accumulate, batch=16)
    assert good.relative_error < 3e-2 and good.dtype_seen == good.expected_dtype
    assert abs(good.loss - good.expected_loss) < 1e-2
    bad = accumulation.amp_check(_summed_not_scaled, batch=16)
    assert bad.dtype_seen == torch.float32 and bad.relative_error > 0.5


RSS_PROBE = """
import json, sys
import torch
import torch.nn.functional as F
from ptcourse.core import measure
from ptcourse.core import seeds
from ptcourse.labs import lab04_grad_accumulation as accumulation
pinned = measure.rss_follows_tensors()
torch.set_num_threads(1)
model = seeds.seeded(lambda: accumulation.conv_net(16), 0)
x, y = accumulation.images(64, 32, generator=torch.Generator().manual_seed(0))

def step(k):
    model.zero_grad(set_to_none=True)
    for xb, yb in zip(x.chunk(k), y.chunk(k)):
        (F.cross_entropy(model(xb), yb) / k).backward()

for k in (1, 4, 2, 1):  # history: big steps first, as a notebook would
    step(k)
peaks = {1: [], 4: []}
for k in (1, 4, 4, 1, 1, 4):
    peaks[k].append(measure.peak_memory(lambda: step(k)).peak_bytes)
print(json.dumps({"pinned": pinned, "peaks": peaks}))
"""


def test_pinned_rss_peaks_repeat_in_either_order():
    result = run_pinned(RSS_PROBE)
    one, four = result["peaks"]["1"], result["peaks"]["4"]
    mb = 2**20
    assert max(one) - min(one) < 2 * mb and max(four) - min(four) < 2 * mb, result
    assert min(one) > 3 * max(four), result  # 4 micro-batches: about 4x less


def test_teacher_task_is_learnable_and_train_sgd_lines_up_by_samples():
    x, y = accumulation.teacher_task(1024, seed=0)
    test = accumulation.teacher_task(512, seed=1)
    assert torch.equal(x, accumulation.teacher_task(1024, seed=0)[0])
    assert len(torch.unique(y)) == 4
    model = seeds.seeded(accumulation.mlp, 0)
    curve = accumulation.train_sgd(
        model, _accumulate, x, y, batch=32, accum_steps=2, lr=0.4, samples=2048, test=test
    )
    assert curve["samples"][0] == 0 and curve["samples"][-1] == 2048
    assert curve["accuracy"][-1] > curve["accuracy"][0] + 0.2


def test_step_variants_and_amp_table_run_on_cpu():
    model = accumulation.mlp(16, 32)
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    variants = accumulation.step_variants(model, _accumulate, x, y, 4)
    assert set(variants) == {"small steps", "accumulated", "big batch"}
    for run in variants.values():
        run()
    rows = accumulation.amp_training_table(
        _accumulate, "cpu", batch=8, image=8, channels=2, accum=(1, 2), min_run_time=0.01
    )
    assert [(r.precision, r.accum_steps) for r in rows] == [
        ("fp32", 1), ("fp32", 2), ("amp", 1), ("amp", 2)
    ]  # fmt: skip
    assert all(r.ms_per_sample > 0 and r.loss == r.loss for r in rows)


def test_sizes_follow_smoke_mode(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    full = accumulation.sizes()
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    smoke = accumulation.sizes()
    assert (full.batch, full.accum_steps, full.image) == (64, 4, 64)
    assert (smoke.batch, smoke.accum_steps, smoke.image) == (64, 4, 32)
    assert smoke.accum_steps in smoke.sweep and full.accum_steps in full.sweep


# ---------------------------------------------------------------------------------------------
# The graders' checks


def test_check_gradients_gives_full_points_to_a_right_step(graded, capsys):
    assert accumulation.check_gradients(_accumulate, points=3) == 3.0
    assert "in all 4 cases" in capsys.readouterr().out


def test_check_gradients_keeps_the_baseline_points(graded):
    """One big batch has the right gradients: the baseline loses the memory and AMP points."""
    assert accumulation.check_gradients(_one_big_batch, points=3) == 3.0


@pytest.mark.parametrize(
    "wrong,message",
    [
        (_summed_not_scaled, "gradient of parameter"),
        (_divided_by_k, "batch 62 in 4 micro-batches: gradient"),
        (_steps_the_weights, "the weights changed"),
    ],
    ids=["summed", "unequal micro-batches", "optimizer step"],
)
def test_check_gradients_fails_wrong_steps(graded, wrong, message):
    with pytest.raises(checks.CheckFailed, match=message):
        accumulation.check_gradients(wrong, points=3)


def test_check_amp_gives_full_points_to_a_right_step(graded, capsys):
    assert accumulation.check_amp(_accumulate, points=1) == 1.0
    assert "autocast" in capsys.readouterr().out


@pytest.mark.parametrize("wrong", [_one_big_batch, _divided_by_k], ids=["baseline", "no autocast"])
def test_check_amp_fails_without_autocast(graded, wrong):
    with pytest.raises(checks.CheckFailed, match="torch.autocast"):
        accumulation.check_amp(wrong, points=1)


MEMORY_PROBE = """
import json, os
os.environ.update(PTCOURSE_SMOKE="1", PTCOURSE_SECRET_SEED="%s", PTCOURSE_TRACK="cpu")
import torch
from ptcourse.core import measure
from ptcourse.grading import checks
from ptcourse.labs import lab04_grad_accumulation as accumulation
pinned = measure.rss_follows_tensors()  # as the notebook's setup cell does
torch.set_num_threads(1)
%s
def graded(step):
    try:
        points = accumulation.check_memory(step, points=3)
    except checks.CheckFailed as failed:
        points = str(failed).splitlines()[0]
    return points, checks.RESULTS[-1].value
print(json.dumps({"pinned": pinned, "right": graded(accumulate), "baseline": graded(one_batch),
                  "summed": graded(summed)}))
"""
HELPERS = """
def accumulate(model, loss_fn, x, y, k, scaler=None):
    for xb, yb in zip(x.tensor_split(k), y.tensor_split(k)):
        (loss_fn(model(xb), yb) * (len(xb) / len(x))).backward()
    return 0.0

def one_batch(model, loss_fn, x, y, k, scaler=None):
    return accumulation.baseline_step(model, loss_fn, x, y)

def summed(model, loss_fn, x, y, k, scaler=None):
    for xb, yb in zip(x.tensor_split(k), y.tensor_split(k)):
        loss_fn(model(xb), yb).backward()
    return 0.0
"""


def test_check_memory_grades_the_peak_and_the_gradients():
    """In a fresh process (a clean heap, as in a notebook): right 3/3, baseline and a step with
    wrong gradients fail."""
    result = run_pinned(MEMORY_PROBE % (SEED, HELPERS))
    points, ratio = result["right"]
    assert points == 3.0 and ratio > 3.0, result
    message, ratio = result["baseline"]
    assert "zero credit" in message and ratio < 1.3, result
    message, _ = result["summed"]  # caught on the warm-up call, before it is measured
    assert "did not produce the full batch's gradients" in message, result


REPLAYS_GRADIENTS = '''
import torch
_kept = {}
def accumulated_step(model, loss_fn, x, y, accum_steps, scaler=None):
    """Right once per model, then its first gradients again: no activations at all."""
    if id(model) in _kept:
        for p, g in zip(model.parameters(), _kept[id(model)]):
            p.grad = g.clone()
        return 0.0
    for xb, yb in zip(x.tensor_split(accum_steps), y.tensor_split(accum_steps)):
        (loss_fn(model(xb), yb) * (len(xb) / len(x))).backward()
    _kept[id(model)] = [p.grad.clone() for p in model.parameters()]
    return 0.0
'''


def test_in_the_judge_the_measured_step_must_leave_its_batchs_gradients(lab_worker, monkeypatch):
    """The judge measures the step in the worker on a fresh batch, then reads the gradients it
    left there: a step that replays earlier gradients (tiny peak) fails."""
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_SECRET_SEED", SEED)
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu")
    worker = lab_worker(REPLAYS_GRADIENTS, {"PTCOURSE_SMOKE": "1", "PTCOURSE_TRACK": "cpu"})
    step = worker.request("lookup", "accumulated_step")
    with pytest.raises(checks.CheckFailed, match="the measured accumulated step did not"):
        accumulation.check_memory(step, points=3)
