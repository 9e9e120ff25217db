"""ptcourse.labs.lab03_mixed_precision: sizes per track, probes, cast counting, and the
checks telling a correct mixed-precision step from an fp32 one and from common mistakes (all on
the CPU, smoke sizes)."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from ptcourse.grading import checks
from ptcourse.labs import lab03_mixed_precision as amp


@pytest.fixture(autouse=True)
def smoke_basic(monkeypatch):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu-basic")


bf16_step = amp.reference_step
scaled_step = amp.reference_scaled_step


def pure_bf16_step(model, optimizer, x, y):
    model.to(torch.bfloat16)  # no fp32 master weights
    return amp.baseline_step(model, optimizer, x, y)


def scaled_step_without_update(model, optimizer, scaler, x, y):
    with torch.autocast(device_type=x.device.type, dtype=torch.float16):
        loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    return loss.detach()


def fp32_ignoring_scaler(model, optimizer, scaler, x, y):
    return amp.baseline_step(model, optimizer, x, y)


def test_sizes_keep_realistic_timed_steps_where_speed_is_graded():
    for track in ("cpu", "cuda"):
        s = amp.sizes(track)
        assert s.text.d_model >= 128 and s.image.arch == "resnet18"
    basic = amp.sizes("cpu-basic")
    assert basic.image.arch == "tiny_cnn" and basic.train == amp.sizes("cpu").train
    assert "smoke" in basic.summary()


def test_probe_sees_autocast_dtypes():
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    x = torch.randn(3, 4)
    with amp.Probe(model) as probe:
        model(x)
    assert probe.fraction(torch.float32) == 1.0
    with amp.Probe(model) as probe, torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert probe.fraction(torch.bfloat16) == 1.0 and len(probe.dtypes) == 2
    model(x)  # hooks are gone after the block
    assert len(probe.dtypes) == 2
    assert amp.Probe(model).fraction(torch.bfloat16) == 0.0


def test_autocast_recasts_weights_per_block_only():
    mlp = amp.weight_heavy_mlp(16, 64)
    xs = [torch.randn(2, 16) for _ in range(3)]

    def separate():
        for x in xs:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                mlp(x)

    def together():
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for x in xs:
                mlp(x)

    weights_and_biases = 6
    assert amp.count_casts(separate).count == 3 * (weights_and_biases + 1)
    assert amp.count_casts(together).count == weights_and_biases + 3
    assert amp.count_casts(lambda: mlp(xs[0])).count == 0


def test_underflow_rows_show_fp16_losing_gradients_and_scaling_keeping_them():
    rows = {(r.loss_weight, r.precision): r for r in amp.underflow_rows(weights=(1e-4,))}
    assert rows[(1e-4, "fp16")].lost > 0.1
    assert rows[(1e-4, "fp16 + scale")].lost < 0.01
    assert rows[(1e-4, "bf16")].lost == 0.0


def test_amp_step_report_tells_mixed_precision_from_fp32_and_pure_bf16():
    good = amp.amp_step_report(bf16_step, seed=3)
    assert good.score == 1.0, good.summary()
    assert amp.amp_step_report(amp.baseline_step, seed=3).score == 0.0
    pure = amp.amp_step_report(pure_bf16_step, seed=3)
    assert pure.lowp_fraction == 1.0 and pure.score < 0.5, pure.summary()


def test_scaled_step_report_needs_scaler_step_and_update():
    assert amp.scaled_step_report(scaled_step, seed=4).score == 1.0
    assert amp.scaled_step_report(scaled_step_without_update, seed=4).score == 0.75
    assert amp.scaled_step_report(fp32_ignoring_scaler, seed=4).score == 0.0


def test_scale_history_backs_off_then_grows():
    history = amp.scale_history(scaled_step, steps=10, init_scale=2.0**24, growth_interval=3)
    assert history.skipped[0] and history.scales[1] == 2.0**23
    assert any(b > a for a, b in zip(history.scales, history.scales[1:], strict=False))


@pytest.fixture
def secret(monkeypatch):
    monkeypatch.setenv(checks.SEED_ENV, "5")


def test_speed_checks_on_basic_cpu_grade_autocast_not_speed(secret, capsys):
    assert amp.check_text_speed(bf16_step, points=3) == 3
    assert "not graded here" in capsys.readouterr().out
    with pytest.raises(checks.CheckFailed):
        amp.check_image_speed(amp.baseline_step, points=3)


def test_speed_check_on_fast_bf16_track_times_against_the_reference(secret, monkeypatch, capsys):
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu")
    small = amp.sizes("cpu-basic")
    monkeypatch.setattr(amp, "sizes", lambda track=None: small)
    assert amp.check_text_speed(amp.reference_step, points=3) == 3
    out = capsys.readouterr().out
    assert "reference solution here" in out  # graded relative to it, or "not gradable" here
    with pytest.raises(checks.CheckFailed, match="not a bf16 mixed-precision training step"):
        amp.check_text_speed(amp.baseline_step, points=3)


def test_step_checks_tell_mixed_precision_from_fp32(secret):
    assert amp.check_amp_step(bf16_step, points=3) == 3
    with pytest.raises(checks.CheckFailed):
        amp.check_amp_step(amp.baseline_step, points=3)
    assert amp.check_scaled_step(scaled_step, points=3) == 3
    with pytest.raises(checks.CheckFailed):
        amp.check_scaled_step(fp32_ignoring_scaler, points=3)


def test_accuracy_check_passes_autocast_and_fails_a_step_that_does_not_learn(secret):
    assert amp.check_accuracy(bf16_step, points=2) == 2

    def frozen(model, optimizer, x, y):
        return F.cross_entropy(model(x), y).detach()  # never updates the weights

    with pytest.raises(checks.CheckFailed):
        amp.check_accuracy(frozen, points=2)


# ---------------------------------------------------------------------------------------------
# In the judge: the steps run in a worker, where the probe and the GradScaler must live too


@pytest.fixture
def worker(lab_worker):
    """A judge's worker (sandboxed where bubblewrap is) with the notebook's two exercises."""
    cell = (
        "import torch\nimport torch.nn.functional as F\n"
        "from ptcourse.labs import lab03_mixed_precision as amp\n"
        "amp_step, scaled_step = amp.reference_step, amp.reference_scaled_step\n"
        "def without_update(model, optimizer, scaler, x, y):\n"
        "    with torch.autocast(device_type=x.device.type, dtype=torch.float16):\n"
        "        loss = F.cross_entropy(model(x), y)\n"
        "    optimizer.zero_grad(set_to_none=True)\n"
        "    scaler.scale(loss).backward()\n"
        "    scaler.step(optimizer)\n"
        "    return loss.detach()\n"
    )
    return lab_worker(cell, {"PTCOURSE_SMOKE": "1", "PTCOURSE_TRACK": "cpu-basic"})


def test_judged_checks_read_what_ran_in_the_worker(worker, secret):
    from ptcourse.judge.remote import Remote

    amp_step, scaled, without_update = (
        worker.request("lookup", name) for name in ("amp_step", "scaled_step", "without_update")
    )
    assert isinstance(amp_step, Remote)
    # hooks on the judge's copy of the model would see no bf16 output: score 0
    assert amp.check_amp_step(amp_step, points=3) == 3
    assert amp.check_text_speed(amp_step, points=3) == 3  # cpu-basic: autocast in effect
    # the GradScaler lives in the worker, where the step updates it
    assert amp.check_scaled_step(scaled, points=3) == 3
    assert amp.check_scaled_step(without_update, points=3) == 1.5
