"""Lab 00 (measuring right): the naive timer, and a roofline exercise that never returns.

"baseline" pastes the naive timer (one call, no warm-up, no sync) into ``time_it``: it must
score 0 on the warm-up and async checks (it may pass the plain compute one, as it should).
"looper" makes ``bound`` spin forever: only the roofline cells may lose points.
"""

NAIVE_TIMER = """
def time_it(fn, *, sync=lambda: None, warmup=3, repeats=20):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
"""

LOOPING_BOUND = """
def matmul_intensity(n, itemsize=4):
    return 2 * n**3 / (3 * n * n * itemsize)


def add_intensity(n, itemsize=4):
    return n / (3 * n * itemsize)


def bound(intensity, ceilings):
    while True:  # a search that never terminates
        pass
"""

VARIANT = {
    "students": {
        "baseline": {"time_it": NAIVE_TIMER},
        "looper": {"roofline": LOOPING_BOUND},
    },
    "speed_checks": ["time_it_warmup", "time_it_async"],
    "loop_checks": ["roofline_quick", "roofline_hidden"],
}
