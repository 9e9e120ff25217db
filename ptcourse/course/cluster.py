"""Grading a class past one machine: the judge steps fan out over a Dask cluster.

Each task is one (student, lab) judge run on one Dask worker, and a worker runs one task at a
time: start one worker per lane, each pinned to its own cores (``taskset -c 0-3 dask worker
SCHEDULER --nthreads 1 --resources lane=1``; docs/grading.md, "A class at scale"), so timed
checks never share a core with another submission. What crosses to a worker is data — the
canonical notebook and the files the student handed in beside it — and what comes back is the
judged notebook; nbgrader's bookkeeping stays on the machine that runs ``ptcourse grade``, so
every score lands in its one gradebook. A worker needs the same checkout of the course (the same
commit, its venv and datasets) and the sandbox (bubblewrap), as any grading machine does.
"""

from __future__ import annotations

import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ptcourse.core.lineup import Lab, lab
from ptcourse.course import autograde

LANE = {"lane": 1}  # the resource each task takes: one worker, one lane


def judge_on_worker(
    number: str, canonical: bytes, handed_in: dict[str, bytes], student: str, timeout_s: float
) -> tuple[bytes, int, str]:
    """Runs on a Dask worker: the judge on this worker's cores; (judged notebook, exit, stderr)."""
    the_lab = lab(number)
    with tempfile.TemporaryDirectory(prefix="ptcourse-judge-") as folder:
        raw = Path(folder) / "submissions" / student / the_lab.name
        raw.mkdir(parents=True)
        for name, content in handed_in.items():
            (raw / name).write_bytes(content)
        copy = Path(folder) / "canonical" / f"{the_lab.name}.ipynb"
        copy.parent.mkdir()
        copy.write_bytes(canonical)
        out = Path(folder) / "judged" / f"{the_lab.name}.ipynb"
        out.parent.mkdir()
        done = autograde._judge(the_lab, copy, raw, out, timeout_s, None)
        judged = out.read_bytes() if out.exists() else b""
        return judged, done.returncode, done.stderr[-2000:]


def dask_judge(client: Any) -> autograde.RemoteJudge:
    """A judge step for :func:`autograde.autograde` that runs each submission's judge on the
    cluster behind ``client`` (a ``distributed.Client``)."""

    def judge(the_lab: Lab, canonical: Path, raw: Path, out: Path, timeout_s: float) -> None:
        handed_in = {p.name: p.read_bytes() for p in raw.iterdir() if p.is_file()}
        future = client.submit(
            judge_on_worker, the_lab.number, canonical.read_bytes(), handed_in, raw.parent.name,
            timeout_s, resources=LANE, pure=False,
        )  # fmt: skip
        judged, returncode, stderr = future.result()
        if returncode != 0:
            raise autograde.StepFailed(stderr.strip()[-500:])
        out.write_bytes(judged)

    return judge


def lanes_of(client: Any) -> int:
    """How many tasks the cluster runs at once: its workers' ``lane`` resources."""
    workers = client.scheduler_info()["workers"].values()
    return int(sum(w.get("resources", {}).get("lane", 0) for w in workers))


@contextmanager
def connect(address: str):
    """A client of the cluster at ``address``, or of a one-worker local cluster ("local")."""
    from distributed import Client, LocalCluster

    if address != "local":
        with Client(address) as client:
            yield client
        return
    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, resources=LANE, dashboard_address=None,
            processes=True,
        ) as cluster,
        Client(cluster) as client,
    ):  # fmt: skip
        yield client
