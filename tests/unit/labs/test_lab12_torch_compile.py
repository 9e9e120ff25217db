"""Lab 12 (torch.compile): the counting backend, the planted breaks, the recompile schedule and
the graders' checks, against right answers, the lab's baseline and cheats."""

import math

import pytest
import torch
import torch.nn.functional as F

from ptcourse.core import hardware
from ptcourse.grading import checks
from ptcourse.labs import lab12_torch_compile as lab


@pytest.fixture(autouse=True)
def _reset_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


# ---------------------------------------------------------------------------------------------
# Answers: right ones, the baseline, and cheats


class OneGraphHead(lab.PlantedHead):
    def forward(self, x):
        f = F.gelu(self.conv(x))
        limit = 16.0 * f.abs().mean()
        peak = f.amax()
        f = torch.where(peak > limit, f * (limit / peak), f)
        heat = torch.sigmoid(self.score(f) - 1.0)
        area = heat.mean(dim=(1, 2, 3))
        return torch.stack([heat.amax(dim=(1, 2, 3)), area], dim=1)


class NeverClips(lab.PlantedHead):
    """One graph, but drops the planted branch: right on plain images, wrong on defects."""

    def forward(self, x):
        heat = torch.sigmoid(self.score(F.gelu(self.conv(x))) - 1.0)
        area = heat.mean(dim=(1, 2, 3))
        return torch.stack([heat.amax(dim=(1, 2, 3)), area], dim=1)


class Disabled(lab.PlantedHead):
    """The planted forward, hidden from dynamo: no graph at all."""

    @torch.compiler.disable
    def forward(self, x):
        return super().forward(x)


@torch.compiler.allow_in_graph
def _planted_forward(head, x):
    return lab.PlantedHead.forward(head, x)


class Smuggled(lab.PlantedHead):
    """The planted forward passed off as one opaque graph node."""

    def forward(self, x):
        return _planted_forward(self, x)


def mark_both_dynamic(model, backend):
    compiled = torch.compile(model, backend=backend)

    def serve(tokens):
        torch._dynamo.mark_dynamic(tokens, 0)
        torch._dynamo.mark_dynamic(tokens, 1)
        return compiled(tokens)

    return serve


def fully_dynamic(model, backend):
    return torch.compile(model, backend=backend, dynamic=True)


def default_compile(model, backend):
    return torch.compile(model, backend=backend)


def ignores_backend(model, backend):
    return torch.compile(model, backend="eager", dynamic=True)


def compiles_then_eager(model, backend):
    """Compiles once, then runs every call in eager: no recompile can ever be detected."""
    compiled = torch.compile(model, backend=backend, dynamic=True)

    def serve(tokens):
        if serve.calls == 0:
            serve.calls += 1
            return compiled(tokens)
        with torch.compiler.set_stance("force_eager"):
            return compiled(tokens)

    serve.calls = 0
    return serve


def reference_inference(model):
    compiled = torch.compile(model, options={"freezing": True})

    def run(images):
        with torch.inference_mode():
            return compiled(images)

    return run


# ---------------------------------------------------------------------------------------------
# Break-even


def test_reference_break_even_by_hand():
    assert lab.reference_break_even(10.0, 2e-3, 1e-3) == 10_000
    assert lab.reference_break_even(1.0, 3e-3, 1e-3) == 500
    assert lab.reference_break_even(0.0, 3e-3, 1e-3) == 0
    assert lab.reference_break_even(5.0, 1e-3, 1e-3) is None
    assert lab.reference_break_even(5.0, 1e-3, 2e-3) is None


def test_check_break_even_passes_the_formula_and_fails_near_misses():
    def right(c, e, k):
        return None if k >= e else math.ceil(c / (e - k))

    assert lab.check_break_even(right, points=2) == 2
    near_misses = [
        lambda c, e, k: None if k >= e else math.floor(c / (e - k)),  # rounds down
        lambda c, e, k: math.inf if k >= e else math.ceil(c / (e - k)),  # inf, not None
        lambda c, e, k: None if k >= e else float(math.ceil(c / (e - k))),  # a float
        lambda c, e, k: math.ceil(c / (e - k)) if k != e else None,  # negative when slower
    ]
    for wrong in near_misses:
        with pytest.raises(checks.CheckFailed, match="break_even_calls"):
            lab.check_break_even(wrong, points=2)


# ---------------------------------------------------------------------------------------------
# Graph breaks


def test_planted_head_breaks_four_times_and_the_inputs_take_both_sides_of_its_branch():
    g = torch.Generator().manual_seed(0)
    inputs = lab.head_inputs(4, 32, g)
    table = lab.explain_table(lab.planted_head(0), inputs[1])
    assert table.startswith("graphs: 5, graph breaks: 4"), table
    for seed in range(6):
        head = lab.planted_head(seed)
        with torch.no_grad():
            taken = []
            for x in lab.head_inputs(3 + seed % 4, 32, g):
                f = F.gelu(head.conv(x))
                taken.append(bool(f.amax() > 16.0 * f.abs().mean()))
        assert taken == [False, True], (seed, taken)


def test_graph_counter_counts_graphs_that_ran_not_discarded_attempts():
    counter = lab.GraphCounter()
    compiled = torch.compile(lab.token_classifier(0), backend=counter, dynamic=True)
    with torch.no_grad():
        for shape in [(6, 22), (6, 47), (10, 22)]:
            compiled(torch.randint(0, 1000, shape))
    assert (counter.graphs, counter.runs) == (1, 3)  # dynamo compiled the first call twice


def test_one_graph_head_passes_and_the_planted_head_fails():
    assert lab.check_one_graph(OneGraphHead, points=3) == 3
    with pytest.raises(checks.CheckFailed, match="expected exactly 1 graph"):
        lab.check_one_graph(lab.PlantedHead, points=3)


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (NeverClips, "max abs difference"),
        (Disabled, "0 graph"),
        (Smuggled, "graph"),
    ],
    ids=["never_clips", "compiler_disable", "allow_in_graph"],
)
def test_one_graph_fails_cheats_and_wrong_heads(answer, says):
    with pytest.raises(checks.CheckFailed, match=says):
        lab.check_one_graph(answer, points=3)


def test_graph_report_from_a_worker_is_checked():
    with pytest.raises(checks.CheckFailed, match="malformed"):
        lab.GraphReport.of({"graphs": 1.0, "runs": 2, "calls": 2, "outputs": [], "error": ""})


# ---------------------------------------------------------------------------------------------
# Recompiles


@pytest.mark.parametrize("seed", range(4))
def test_the_secret_schedule_makes_automatic_dynamic_shapes_compile_three_times(seed):
    warm, _ = lab.recompile_schedule(torch.Generator().manual_seed(seed))
    counter = lab.GraphCounter()
    compiled = torch.compile(lab.token_classifier(0), backend=counter)
    with torch.no_grad():
        for tokens in lab.token_batches(tuple(warm), 1000, torch.Generator().manual_seed(1)):
            compiled(tokens)
    assert counter.graphs == 3


@pytest.mark.parametrize("answer", [mark_both_dynamic, fully_dynamic], ids=lambda f: f.__name__)
def test_bounded_recompiles_pass(answer):
    assert lab.check_recompiles(answer, points=3) == 3


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (lab.baseline_compile, "fail_on_recompile"),
        (default_compile, "expected at most 2|fail_on_recompile"),
        (ignores_backend, "nothing was compiled"),
        (compiles_then_eager, "run 1 times"),
    ],
    ids=["baseline_dynamic_false", "automatic_dynamic", "ignores_backend", "eager_after_first"],
)
def test_recompiles_fail_the_baseline_and_cheats(answer, says):
    with pytest.raises(checks.CheckFailed, match=says):
        lab.check_recompiles(answer, points=3)


# ---------------------------------------------------------------------------------------------
# Compiled for inference


def test_defect_scorer_bn_is_not_the_identity_and_folding_keeps_outputs():
    model = lab.defect_scorer(0)
    bn = model.features[1]
    assert not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
    x = lab.images(2, 32, torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(lab.folded_bn(model)(x), model(x), atol=1e-5, rtol=1e-5)


def test_inference_speed_is_not_gradable_without_a_compiler(monkeypatch):
    monkeypatch.setenv("PTCOURSE_TRACK", "cpu-basic")
    with pytest.raises(checks.CheckFailed, match="not gradable on this machine"):
        lab.check_inference_speed(reference_inference, points=4)


def test_cxx_compiler_probe_says_no_without_a_compiler():
    import torch._inductor.config as inductor_config

    hardware.cxx_compiler.cache_clear()
    try:
        with inductor_config.patch({"cpp.cxx": (None, "/nonexistent/c++")}):
            probe = hardware.cxx_compiler()
        assert not probe.available and probe.detail
    finally:
        hardware.cxx_compiler.cache_clear()


@pytest.mark.skipif(not hardware.has("cxx_compiler"), reason="inductor needs a C++ compiler")
def test_inference_speed_passes_the_reference_and_fails_eager(monkeypatch):
    """Timed (smoke sizes): the reference compiled with freezing earns points, eager earns 0."""
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    assert lab.check_inference_speed(reference_inference, points=4) > 0
    with pytest.raises(checks.CheckFailed):
        lab.check_inference_speed(lambda model: model, points=4)


def test_the_baseline_compiles_every_new_shape_until_the_limit_then_runs_eager():
    stream = lab.token_batches(lab.sizes().stream, 1000, torch.Generator().manual_seed(0))
    counter = lab.GraphCounter()
    compiled = lab.stream_report(lab.baseline_compile(lab.token_classifier(0), counter), stream)
    limit = torch._dynamo.config.recompile_limit
    assert len(stream) > limit
    assert compiled == [True] * limit + [False] * (len(stream) - limit)
    assert (counter.graphs, counter.runs) == (limit, limit)


@pytest.mark.parametrize("native", ["AVX2", "AVX512", "DEFAULT"])
def test_each_cpu_configuration_gets_its_own_inductor_cache(monkeypatch, native):
    """The cache folder is keyed by the capability PyTorch dispatches to and the oneDNN cap, not
    by the variables that ask for them, whatever the native CPU is: on an AVX2-only CPU
    ``ATEN_CPU_CAPABILITY=avx2`` is the native configuration and shares its folder."""

    def cache_under(dispatched, **env):
        for name in ("TORCHINDUCTOR_CACHE_DIR", "ONEDNN_MAX_CPU_ISA"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: dispatched)
        return hardware.separate_inductor_cache()

    folder = cache_under(native)
    assert native.lower() in folder
    assert cache_under(native) == folder
    others = {cache_under(cap) for cap in ("DEFAULT", "AVX2", "AVX512")} - {folder}
    assert len(others) == 2
    assert cache_under(native, ONEDNN_MAX_CPU_ISA="AVX2") not in others | {folder}
    assert cache_under(native, TORCHINDUCTOR_CACHE_DIR="/tmp/mine") == "/tmp/mine"


def test_the_cache_key_follows_what_aten_cpu_capability_dispatches_to():
    import os
    import subprocess
    import sys

    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert run.stdout.strip() == "DEFAULT", run.stderr


def test_where_speed_is_not_gradable_a_compiled_answer_keeps_its_points_and_eager_does_not(
    monkeypatch,
):
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    monkeypatch.setattr(checks, "relative_speedup", lambda *a, not_gradable, **k: not_gradable("x"))
    assert lab.check_inference_speed(reference_inference, points=4) == 4
    with pytest.raises(checks.CheckFailed, match="compiled no graph"):
        lab.check_inference_speed(lambda model: model, points=4)
