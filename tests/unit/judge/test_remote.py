"""The judge's channel to the worker: only data comes back, the judge's clock times the worker,
extra threads cost their CPU time, a frozen worker uses nothing, a hung one is killed."""

import operator
import os
import time

import pytest
import torch
from judged import run

from ptcourse.judge.remote import Remote, WorkerError, WorkerGone

SQUARE = "import torch\ndef square(x):\n    return x * x\n"


def _anything(args, output):
    """A verifier that accepts every output (the tests here are about time, not answers)."""


def test_data_comes_back_as_data_and_functions_as_references(make_worker):
    worker = make_worker()
    run(worker, SQUARE + "table = {'a': torch.ones(2), 'b': [1, 2.5, 'x', None], 'c': {1: 0.5}}")
    table = worker.request("lookup", "table")
    assert table["b"] == [1, 2.5, "x", None] and table["c"] == {1: 0.5}  # a curve: int keys
    square = worker.request("lookup", "square")
    assert isinstance(square, Remote)
    assert torch.equal(square(torch.arange(3)), torch.tensor([0, 1, 4]))


def test_numpy_scalars_come_back_as_python_numbers_and_their_subclasses_as_references(
    make_worker,
):
    worker = make_worker()
    run(
        worker,
        "import numpy as np\n"
        "class Liar(np.int64):\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "found = [np.int64(64), np.float32(0.5), np.bool_(True), Liar(3)]",
    )
    found = worker.request("lookup", "found")
    assert found[:3] == [64, 0.5, True] and type(found[0]) is int and type(found[2]) is bool
    assert isinstance(found[3], Remote)


def test_objects_that_would_run_code_in_the_judge_never_leave_the_worker(make_worker):
    worker = make_worker()
    run(
        worker,
        "import torch\n"
        "class Evil:\n"
        "    def __reduce__(self):\n"
        "        return (print, ('pwned',))\n"
        "evil = Evil()\n"
        "mixed = [torch.zeros(1), Evil()]",
    )
    assert isinstance(worker.request("lookup", "evil"), Remote)
    run(
        worker,
        "class Key(int):\n    def __eq__(self, other):\n        return True\n"
        "    __hash__ = int.__hash__\nkeyed = {Key(1): 2.0}",
    )
    assert isinstance(worker.request("lookup", "keyed"), Remote)
    assert isinstance(worker.request("lookup", "mixed")[1], Remote)


def test_a_raising_answer_is_the_submissions_error(make_worker):
    worker = make_worker()
    run(worker, "def broken(x):\n    raise ValueError('nope')")
    with pytest.raises(WorkerError, match="nope"):
        worker.request("lookup", "broken")(1)
    with pytest.raises(WorkerError, match="not defined"):
        worker.request("lookup", "missing")


def test_modules_passed_in_are_mirrored_and_updated(make_worker):
    worker = make_worker()
    run(
        worker,
        "import torch\n"
        "def step(model, opt, x):\n"
        "    opt.zero_grad()\n"
        "    model(x).sum().backward()\n"
        "    opt.step()\n"
        "    return 1.5\n"
        "def setup(model):\n"
        "    return torch.optim.SGD(model.parameters(), lr=0.1)",
    )
    step, setup = worker.request("lookup", "step"), worker.request("lookup", "setup")
    model = torch.nn.Linear(3, 1)
    before = model.weight.detach().clone()
    opt = setup(model)
    x = torch.ones(2, 3)
    assert step(model, opt, x) == 1.5 and step(model, opt, x) == 1.5
    assert torch.allclose(model.weight, before - 2 * 0.1 * 2 * torch.ones(1, 3))
    assert torch.allclose(model.weight.grad, 2 * torch.ones(1, 3))


def test_the_judge_times_the_call_and_checks_an_output(make_worker):
    worker = make_worker()
    run(worker, SQUARE + "def lazy(x):\n    return x")
    checked = []

    def verify(args, out):
        checked.append(True)
        if not torch.equal(out, args[0] * args[0]):
            raise AssertionError("wrong output")

    timed = worker.request("lookup", "square").timed(lambda: (torch.randn(100),), verify)
    assert timed.time_block(5) > 0 and checked == [True] * 5  # every output of a short block
    with pytest.raises(AssertionError, match="wrong output"):
        worker.request("lookup", "lazy").timed(lambda: (torch.randn(100),), verify).time_block(5)


def test_threads_the_judge_did_not_grant_are_charged_their_cpu_time(make_worker):
    worker = make_worker()
    run(
        worker,
        "import threading, time, torch\n"
        "def spin(seconds):\n"
        "    a, end = torch.randn(300, 300), time.perf_counter() + seconds\n"
        "    while time.perf_counter() < end:\n"
        "        a @ a  # releases the GIL: two threads really run at once\n"
        "def two_threads(seconds):\n"
        "    helper = threading.Thread(target=spin, args=(seconds,))\n"
        "    helper.start(); spin(seconds); helper.join()\n",
    )
    timed = worker.request("lookup", "two_threads").timed(lambda: (0.2,), _anything)
    timed.time_block(1)
    before = worker.accounting.cpu_seconds()
    per_call = timed.time_block(1)
    used = worker.accounting.cpu_seconds() - before  # ~0.4 s with a free core, ~0.2 s without
    assert per_call >= 0.9 * used and per_call >= 0.2, (per_call, used)


def test_a_frozen_worker_uses_no_cpu(make_worker):
    worker = make_worker()
    run(
        worker,
        "import threading\n"
        "def forever():\n"
        "    while True:\n"
        "        pass\n"
        "threading.Thread(target=forever, daemon=True).start()",
    )
    worker.freeze()
    before = worker.accounting.cpu_seconds()
    time.sleep(0.3)
    assert worker.accounting.cpu_seconds() - before < 0.01
    worker.thaw()
    time.sleep(0.3)
    assert worker.accounting.cpu_seconds() - before > 0.1


def test_a_hung_call_kills_the_worker_within_the_deadline(make_worker):
    worker = make_worker()
    run(
        worker,
        "import signal\n"
        "def hang():\n"
        "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
        "    while True:\n"
        "        pass",
    )
    start = time.monotonic()
    with pytest.raises(WorkerGone):
        worker.request("call", worker.request("lookup", "hang"), (), {}, False, timeout=1.0)
    assert time.monotonic() - start < 5 and worker.process is None


def test_a_generator_passed_in_advances_as_it_would_in_the_notebook(make_worker):
    worker = make_worker()
    run(worker, "import torch\ndef draw(gen):\n    return torch.rand(2, generator=gen)")
    draw = worker.request("lookup", "draw")
    gen, twin = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    first, second = draw(gen), draw(gen)
    assert torch.equal(first, torch.rand(2, generator=twin))
    assert torch.equal(second, torch.rand(2, generator=twin))  # not the same draw twice


def test_a_result_kept_in_the_worker_is_driven_there(make_worker):
    from ptcourse.grading import checks

    worker = make_worker()
    run(worker, "import torch\ndef build(n):\n    return torch.arange(n)")
    build = worker.request("lookup", "build")
    kept = checks.beside(build, operator.call, 4, keep=True)
    assert isinstance(kept, Remote)  # a tensor, but it stayed in the worker
    timed = checks.timed(kept, lambda: (torch.tensor(2),), _anything, via=operator.mul)
    assert torch.equal(timed(), torch.arange(4) * 2)
    assert timed.time_block(3) > 0


def test_the_graders_code_runs_in_a_twin_the_submission_cannot_reach(make_worker):
    from ptcourse.grading import checks

    worker = make_worker()
    run(worker, "import os\nos.environ['PATCHED'] = '1'\ndef f(x):\n    return x")
    answer = worker.request("lookup", "f")
    # The twin is another sandboxed process: what the notebook did to its own is not there.
    assert checks.run_alike(answer, os.getenv, "PATCHED") is None
    assert worker.request("call", os.getenv, ("PATCHED",), {}, False)["value"] == "1"
    assert worker.trusted is not None and worker.trusted.process.pid != worker.process.pid
    model = torch.nn.Linear(4, 2)
    baseline = checks.timed_alike(answer, model, lambda: (torch.randn(3, 4),), inference=True)
    assert baseline.time_block(4) > 0
    assert baseline.worker is worker.trusted and id(model) in worker.trusted.mirrors
    worker.kill()
    assert worker.trusted.process is None  # killed with the student's worker


def test_a_call_that_changes_a_models_dtype_or_structure_comes_back_as_it_left_it(make_worker):
    worker = make_worker()
    run(
        worker,
        "import torch\n"
        "def to_bf16(model):\n"
        "    model.to(torch.bfloat16)\n"
        "    return 1\n"
        "def restructure(model):\n"
        "    model[1] = torch.nn.Identity()\n"
        "    return 2",
    )
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    weight = model[0].weight
    assert worker.request("lookup", "to_bf16")(model) == 1
    assert model[0].weight is weight and weight.dtype == torch.bfloat16
    other = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    assert worker.request("lookup", "restructure")(other) == 2  # no "missing keys"


def test_the_courses_code_in_the_worker_is_read_from_disk_not_from_the_notebooks_patches(
    make_worker,
):
    from ptcourse.labs import lab05_efficient_blocks as blocks

    worker = make_worker()
    run(
        worker,
        "import torch\n"
        "import ptcourse.core.measure as measure\n"
        "import ptcourse.labs.lab05_efficient_blocks as blocks\n"
        "measure.count_flops = lambda fn: 1\n"
        "blocks.parameter_count = lambda module: 42\n"
        "def block():\n"
        "    return torch.nn.Conv2d(2, 2, 1, bias=False)",
    )
    built = worker.request("lookup", "block")()
    assert built.beside(blocks.parameter_count) == 4
    assert built.beside(blocks.flops_of, torch.randn(1, 2, 3, 3)) == 2 * 4 * 9
