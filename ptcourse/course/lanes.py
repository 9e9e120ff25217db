"""Lanes: several jobs at once on one machine, each lane on its own cores (``--lanes N``).

``ptcourse grade`` judges one submission per lane and ``ptcourse run`` executes one notebook per
lane; a lane's processes are pinned to its cores (``taskset``, inherited by every child: the
judge's worker, the notebook's kernel), so timing in one lane never shares a core with another.
"""

from __future__ import annotations

import os
import queue
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import TypeVar

Job = TypeVar("Job")
Result = TypeVar("Result")


def core_plan(cores: list[int], lanes: int) -> list[list[int]]:
    """Split ``cores`` into ``lanes`` disjoint groups, one per lane (each at least one core)."""
    lanes = max(1, min(lanes, len(cores)))
    share = len(cores) // lanes
    return [cores[i * share : (i + 1) * share] for i in range(lanes)]


def pinned(command: list[str], cores: list[int] | None) -> list[str]:
    """``command`` run on ``cores`` only (unchanged without cores)."""
    return ["taskset", "--cpu-list", ",".join(map(str, cores)), *command] if cores else command


def run_in_lanes(
    jobs: Iterable[Job],
    work: Callable[[Job, list[int]], Result],
    plan: list[list[int]],
    done: Callable[[Result, int, int], None] = lambda result, count, total: None,
) -> list[Result]:
    """``work(job, cores)`` for every job, one lane of ``plan`` each, as many at once as there
    are lanes; ``done(result, count, total)`` as each finishes. Results in the order of jobs."""
    free: queue.Queue[list[int]] = queue.Queue()
    for cores in plan:
        free.put(cores)

    def in_a_lane(job: Job) -> Result:
        cores = free.get()
        try:
            return work(job, cores)
        finally:
            free.put(cores)

    with ThreadPoolExecutor(max_workers=len(plan)) as pool:
        futures = [pool.submit(in_a_lane, job) for job in jobs]
        for count, future in enumerate(as_completed(futures), start=1):
            done(future.result(), count, len(futures))
        return [future.result() for future in futures]


def this_machine(lanes: int) -> list[list[int]]:
    """The lanes of this process's cores."""
    return core_plan(sorted(os.sched_getaffinity(0)), lanes)
