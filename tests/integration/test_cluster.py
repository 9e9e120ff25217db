"""Grading through a Dask cluster (`ptcourse grade --cluster`): each (student, lab) judge runs as
one task on a worker with its own lane, and every score lands in the one local gradebook."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from labs_under_test import selected_labs

from ptcourse.course import autograde, paths

pytestmark = pytest.mark.grading
LAB = "04"  # the quickest lab to judge (16 s smoke), with a memory check timed in the twin

# Run in a fresh process so that PTCOURSE_BUILD puts the gradebook in the test's folder.
GRADE_ON_A_LOCAL_CLUSTER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from distributed import get_task_stream
    from ptcourse.course import autograde, cluster

    with cluster.connect("local") as client, get_task_stream(client) as stream:
        start = time.perf_counter()
        scores = autograde.autograde(Path(sys.argv[1]), [sys.argv[2]], 900,
                                     cluster.lanes_of(client), remote=cluster.dask_judge(client))
        seconds = time.perf_counter() - start
    tasks = [t for t in stream.data if t["key"].startswith("judge_on_worker")]
    print(json.dumps({
        "scores": [s.__dict__ for s in scores], "seconds": seconds,
        "tasks": [{"worker": t["worker"], "seconds": sum(s["stop"] - s["start"]
                   for s in t["startstops"] if s["action"] == "compute")} for t in tasks],
    }))
    """
)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    if selected_labs() and LAB not in selected_labs():
        pytest.skip(f"PTCOURSE_TEST_LABS leaves out Lab {LAB}")
    pytest.importorskip("distributed", reason="Dask's distributed is in the test extra")
    root = tmp_path_factory.mktemp("cluster")
    the_lab = paths.course_labs([LAB])[0]
    autograde.copy_submission(paths.notebook(the_lab), root / "subs", "reference", the_lab)
    autograde.copy_submission(paths.notebook(the_lab, "labs"), root / "subs", "blank", the_lab)
    env = {**os.environ, "PTCOURSE_SMOKE": "1", "PTCOURSE_BUILD": str(root / "build")}
    command = [sys.executable, "-c", GRADE_ON_A_LOCAL_CLUSTER, str(root / "subs"), LAB]
    done = subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=1200
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"graded on a one-worker local Dask cluster: {result}")
    return result, root / "build"


def test_each_submission_is_one_task_on_the_worker(graded):
    result, _ = graded
    assert len(result["tasks"]) == 2, result["tasks"]
    assert all(task["seconds"] > 1 for task in result["tasks"])


def test_scores_land_in_the_one_gradebook_as_a_local_grading_would_give_them(graded):
    result, build = graded
    scores = {s["student"]: s for s in result["scores"]}
    assert scores["reference"]["status"] == "graded", scores["reference"]["detail"]
    assert scores["reference"]["auto_score"] == scores["reference"]["auto_max"] > 0
    assert scores["blank"]["status"] == "graded" and scores["blank"]["auto_score"] == 0
    assert (build / "nbgrader" / "gradebook.db").exists()
    feedback = build / "nbgrader" / "feedback" / "reference"
    assert f"[lab {LAB} ·" in next(feedback.rglob("*.html")).read_text()
