"""The project's own cheating submissions, one per class of attack, and honest variations.

Each attack is a base submission — "blank" (the student version), "baseline" (the lab's
baseline pasted into every exercise) or "reference" (the solution) — plus cells inserted at
the start (after the locked setup) or at the end (after the last exercise, before the first
hidden test), plus files handed in beside the notebook. An attack must earn, cell by cell, no
more than its base earns in the same grading run; an honest variation exactly what its base
earns. ``in_slice`` marks the ones CI runs (``PTCOURSE_ADVERSARIAL=all`` runs every one).
"""

from dataclasses import dataclass, field

from grading_run import MARKER  # in the command line of every process an attack leaves


@dataclass(frozen=True)
class Attack:
    name: str
    lab: str
    base: str
    start: tuple[str, ...] = ()
    end: tuple[str, ...] = ()
    files: dict[str, str] = field(default_factory=dict)
    honest: bool = False
    in_slice: bool = False


REWRITE_LATER_CELLS = """
def _full_marks(lines):
    text = "".join(lines)
    return ["3.0\\n"] if "fresh(" in text or "Quick tests" in text else lines

get_ipython().input_transformers_cleanup.append(_full_marks)
"""

PATCH_GRADERS = """
import importlib, ptcourse.labs, ptcourse.grading.checks as checks
checks.score = lambda goal, value, *, points, **kw: points
checks.check_close = lambda *args, **kwargs: None
importlib.reload = lambda module: module

class _Anything:
    def __getattr__(self, name):
        return lambda *args, points=0, **kwargs: float(points)

ptcourse.labs.fresh = lambda key: _Anything()
for path in (checks.__file__, ptcourse.labs.__file__):
    try:
        with open(path, "a") as f:
            f.write("\\n# rewritten by a submission\\n")
    except OSError as error:
        print("could not rewrite", path, error)
"""

# Lab 11: make the replay forgiving where the notebook can reach it (the grader's objective,
# the reference it is graded against, the simulator itself) and report a tiny batch-1 time.
RIG_THE_REPLAY = """
import dataclasses as _dc
import ptcourse.labs.lab11_batching as _b
_b.full_credit_share = lambda name, share: 0.0
_b.load_goal = lambda name, share: _b.targets.Goal(
    _dc.replace(_b.targets.goal(_b.TARGETS, f"{name}_load").row, target=0.0, floor=-1.0),
    _b.targets.goal(_b.TARGETS, f"{name}_load").track,
)
_b.heavy_is_gradable = lambda curve: False
_b.reference_knobs = lambda curve: (1, 0.0)
_b.reference_dispatch = lambda ages, max_batch, max_wait: 1
_b.grading_curve = lambda answer=None: {b: 1.0 for b in (1, 2, 4, 8, 16, 32, 64, 128)}
_real_simulate = _b.simulate
_b.simulate = lambda arrivals, dispatch, knobs, curve: _real_simulate(
    arrivals[:1], dispatch, knobs, curve
)
"""

# Lab 12: report one graph and no recompile, with the eager outputs, from the functions that
# count in the worker; make the reference as slow as eager.
RIG_THE_COUNTS = """
import torch
import ptcourse.labs.lab12_torch_compile as _c

def _report(outputs):
    n = len(outputs)
    return {"graphs": 1, "runs": n, "calls": n, "outputs": outputs, "error": ""}

def _graphs(make_head, state, inputs):
    head = _c.PlantedHead()
    head.load_state_dict(state)
    with torch.no_grad():
        return _report([head(x) for x in inputs])

def _recompiles(compile_for_any_length, seed, warm, new):
    model = _c.token_classifier(seed)
    with torch.no_grad():
        return _report([model(t) for t in warm + new])

_c.count_graphs, _c.count_recompiles = _graphs, _recompiles
_c.GraphReport.of = classmethod(lambda cls, data: cls(**data))
_c.MAX_COMPILES = 10**6
_c.ReferenceCompiled = lambda model: model
"""

# Lab 13: fast, wrong reports from the functions the judge runs in the worker, and everything
# the notebook can reach that judges them made forgiving (the judge's own copies are untouched).
RIG_THE_LINE = """
import ptcourse.labs.lab13_capstone as _l

def _all_clean(line, frames):
    return [{"defective": False, "kind": "clean", "regions": []} for _ in frames]

def _staged(line, frames):
    return _all_clean(line, frames), dict.fromkeys(("decode", "preprocess", "model", "post"), 1e-3)

_l.run_line, _l.staged_run = _all_clean, _staged
_l.valid_reports = lambda reports, frames: reports
_l.Agreement.__call__ = lambda self, args, reports: None
_l.ReferenceLine = _l.BaselineLine
_l.BREAKDOWN_TOLERANCE = 10.0
"""

PATCH_CLOCKS = """
import time, timeit
_real = time.perf_counter
time.perf_counter = lambda: _real() * 0.001
time.monotonic = time.perf_counter
timeit.default_timer = time.perf_counter
"""

SABOTAGE_BASELINE = """
import time
import ptcourse.assets.models as models
import ptcourse.labs.lab06_attention as lab
_naive = lab.baseline_attention

def _slow(*args, **kwargs):
    time.sleep(0.05)
    return _naive(*args, **kwargs)

lab.baseline_attention = _slow
models.naive_attention = _slow
"""

BUSY_NEIGHBOURS = f'''
import subprocess, sys, threading
subprocess.Popen(
    [sys.executable, "-c", "while True: pass", "{MARKER}"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)

def _spin():
    while True:
        pass

threading.Thread(target=_spin, daemon=True).start()
'''

MEMOISE = """
_uncached = attention_sdpa
_cache = {}

def attention_sdpa(q, k, v, mask=None):
    key = (tuple(q.shape), float(q.flatten()[:64].sum()), mask is None)
    if key not in _cache:
        _cache[key] = _uncached(q, k, v, mask)
    return _cache[key]
"""

EXTRA_THREADS = """
_one_thread = attention_sdpa

def attention_sdpa(q, k, v, mask=None):
    torch.set_num_threads(2)
    return _one_thread(q, k, v, mask)
"""

SEED_AND_TRACK = """
import os
import ptcourse.core.hardware as hardware
os.environ["PTCOURSE_SECRET_SEED"] = "0"
os.environ["PTCOURSE_SMOKE"] = "1"
hardware.track_for = lambda *args, **kwargs: None
"""

FILL_DISK = """
import os
try:
    with open("ballast", "wb") as f:
        while True:
            f.write(b"0" * 2**24)
except OSError as error:
    print("disk full:", error)
"""

FILL_MEMORY = """
ballast = []
try:
    while True:
        ballast.append(bytearray(2**28))
except MemoryError:
    print("memory full after", len(ballast) / 4, "GiB")
"""

IGNORE_INTERRUPTS = """
import signal
signal.signal(signal.SIGINT, signal.SIG_IGN)
while True:
    pass
"""

EQUALS_EVERYTHING = """
class _Equal(str):
    def __eq__(self, other):
        return True
    __hash__ = str.__hash__
    def lower(self):
        return self

DOMINANT_OP, DOMINANT_SHAPE, DOMINANT_STAGE = _Equal("x"), _Equal("y"), _Equal("z")
SUSPECTS = {_Equal("backward"): 0.8, _Equal("optimizer"): 0.1}
"""

HONEST_NOISE = """
import sys, warnings
print("a note of my own on stderr", file=sys.stderr)
warnings.warn("a warning from my own cell")
_quiet = attention_sdpa

def attention_sdpa(q, k, v, mask=None):
    warnings.warn("correct, but chatty")
    return _quiet(q, k, v, mask)
"""

PATCH_HARNESS = """
import torch
import ptcourse.labs.lab01_data_loading as lab

def _no_work(cached_batches, cache, batch_size, seed, count, device):
    g = torch.Generator().manual_seed(seed)
    images = torch.randn(batch_size, 3, 224, 224, generator=g)
    return [(images, torch.zeros(batch_size, dtype=torch.long))] * count

lab.pull_batches = _no_work  # the speed check's harness, which runs in the worker
"""

# --- Classes against the judge's protocol and accounting (issue "the judge trusts only what it
# sees from outside"): each on a slow base, so any time or memory it buys shows as points.

# The worker's own request loop, patched: every block's outputs are the first call's, repeated
# (a tenth of the work). The outputs drawn after the block catch it.
PATCH_THE_WORKER = """
import sys
_worker = sys.modules["__main__"]
if hasattr(_worker, "Worker"):
    def _run(self, target, arg_sets, threads, inference):
        first = self.objects.encode(target(*arg_sets[0]))
        return [first] * len(arg_sets)
    _worker.Worker.run = _run
"""

# The work done in a child process: its time and memory are not the worker's (per-process
# accounting listed the worker's processes before the call; a control group counts them all).
IN_A_CHILD = """
import multiprocessing as _mp
_ctx = _mp.get_context("fork")
_own = attention_sdpa

def _in_child(q, k, v, mask, out):
    out.put(_own(q, k, v, mask))

def attention_sdpa(q, k, v, mask=None):
    out = _ctx.Queue()
    child = _ctx.Process(target=_in_child, args=(q, k, v, mask, out))
    child.start()
    result = out.get()
    child.join()
    return result
"""

# Processes that keep forking short-lived busy children, meant to run while the baseline is
# timed: the freezer stops the whole group at once, a fork mid-freeze included.
FORK_WHILE_FROZEN = f"""
import subprocess, sys
_SPAWNER = (
    "import os, time\\n"
    "while True:\\n"
    "    if os.fork() == 0:\\n"
    "        end = time.time() + 0.05\\n"
    "        while time.time() < end:\\n"
    "            pass\\n"
    "        os._exit(0)\\n"
    "    os.wait()\\n"
)
subprocess.Popen(
    [sys.executable, "-c", _SPAWNER, "{MARKER}"],
    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
"""

# Less work when timed: the answer looks at its caller and returns zeros inside a timed block.
STACK_AWARE = """
import inspect, torch
_honest = attention_sdpa

def attention_sdpa(q, k, v, mask=None):
    if any(frame.function in ("run", "keep") for frame in inspect.stack()[1:6]):
        return torch.zeros_like(q)
    return _honest(q, k, v, mask)
"""

# Lab 06: the memory-measured call returns zeros of the right shape for large inputs (on the
# naive baseline, whose memory points a zeros answer would otherwise buy).
ZEROS_WHEN_LARGE = """
import torch
_honest = attention_sdpa

def attention_sdpa(q, k, v, mask=None):
    if q.shape[-2] >= 2048:
        return torch.zeros_like(q)
    return _honest(q, k, v, mask)
"""

# Lab 09: the slow step trains for three calls, then returns a plausible constant loss (fast).
PLAUSIBLE_LOSS = """
_calls = [0]
_honest_step = fast_step

def fast_step(model, opt, tokens, labels):
    _calls[0] += 1
    if _calls[0] <= 3:
        return _honest_step(model, opt, tokens, labels)
    return 1.3
"""


# Lab 00: a timer that reads the answer off the workload it is handed (a kernel's or a warming
# function's duration) instead of measuring; the graded workloads carry amounts of work only.
READ_THE_WORKLOAD = """
import functools
_naive = time_it

def time_it(fn, *, sync=lambda: None, warmup=3, repeats=20):
    target = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn
    for name in ("seconds", "steady_s"):
        if isinstance(getattr(target, name, None), float):
            return getattr(target, name)
    cells = [c.cell_contents for c in (getattr(fn, "__closure__", None) or ())]
    numbers = [c for c in cells if isinstance(c, float)]
    if len(numbers) >= 2:
        return numbers[-1]
    return _naive(fn, sync=sync, warmup=warmup, repeats=repeats)
"""


ATTACKS = (
    Attack("rewrite_later_cells", "06", "blank", start=(REWRITE_LATER_CELLS,), in_slice=True),
    Attack("patch_graders_and_files", "06", "blank", start=(PATCH_GRADERS,), in_slice=True),
    Attack("patch_clocks", "06", "baseline", start=(PATCH_CLOCKS,)),
    Attack("sabotage_baseline", "06", "baseline", start=(SABOTAGE_BASELINE,)),
    Attack("busy_neighbours", "06", "baseline", start=(BUSY_NEIGHBOURS,), in_slice=True),
    Attack("memoise_inputs", "06", "baseline", end=(MEMOISE,)),
    Attack("extra_threads", "06", "baseline", end=(EXTRA_THREADS,), in_slice=True),
    Attack(
        "files_beside_notebook",
        "06",
        "blank",
        files={"ptcourse.py": "raise SystemExit('shadowed')", "torch.py": "raise SystemExit"},
    ),
    Attack("seed_and_track", "06", "blank", start=(SEED_AND_TRACK,)),
    Attack("fill_disk", "06", "blank", start=(FILL_DISK,)),
    Attack("fill_memory", "06", "blank", start=(FILL_MEMORY,)),
    Attack("ignore_interrupts", "06", "reference", start=(IGNORE_INTERRUPTS,), honest=True),
    Attack("equals_everything", "09", "blank", end=(EQUALS_EVERYTHING,)),
    # The same classes on the labs judged later: every lab's hidden checks are out of reach.
    Attack("rewrite_later_cells_00", "00", "blank", start=(REWRITE_LATER_CELLS,)),
    Attack("patch_graders_05", "05", "blank", start=(PATCH_GRADERS,)),
    Attack("patch_harness", "01", "baseline", start=(PATCH_HARNESS,)),
    Attack("patch_graders_11", "11", "blank", start=(PATCH_GRADERS,)),
    Attack("rig_the_replay_11", "11", "baseline", end=(RIG_THE_REPLAY,), in_slice=True),
    Attack("rig_the_counts_12", "12", "baseline", end=(RIG_THE_COUNTS,)),
    Attack("rig_the_line_13", "13", "baseline", end=(RIG_THE_LINE,)),
    Attack("honest_noise", "06", "reference", end=(HONEST_NOISE,), honest=True, in_slice=True),
    Attack("patch_the_worker_06", "06", "baseline", end=(PATCH_THE_WORKER,), in_slice=True),
    Attack("in_a_child_06", "06", "baseline", end=(IN_A_CHILD,), in_slice=True),
    Attack("fork_while_frozen_06", "06", "baseline", start=(FORK_WHILE_FROZEN,)),
    Attack("stack_aware_06", "06", "baseline", end=(STACK_AWARE,)),
    Attack("zeros_when_large_06", "06", "baseline", end=(ZEROS_WHEN_LARGE,)),
    Attack("plausible_loss_09", "09", "baseline", end=(PLAUSIBLE_LOSS,), in_slice=True),
    Attack("patch_the_worker_09", "09", "baseline", end=(PATCH_THE_WORKER,)),
    Attack("patch_the_worker_13", "13", "baseline", end=(PATCH_THE_WORKER,)),
    Attack("read_the_workload_00", "00", "baseline", end=(READ_THE_WORKLOAD,)),
)
