"""A workshop on a real JupyterHub (deploy/jupyterhub_config.py, deploy/nbgrader_config.py).

The hub runs on free localhost ports with two students and an instructor. The students' steps
go through the hub: a service token starts each student's server with the hub's REST API, and
each step is a request to that server, as the student's own session, to nbgrader's own
server extension (``/assignments/fetch``, ``/submit``, ``/fetch_feedback``: what the Lab's
Assignments tab calls) and to Jupyter Server's contents API (the student's work). The
instructor's steps are nbgrader's commands and ``ptcourse grade``, run from the repository with
the same exchange: what an instructor types in a terminal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote, urlencode
from urllib.request import Request, urlopen

import pytest

from ptcourse.course import paths

pytestmark = pytest.mark.workshop

LAB = "00-measuring-right"
COURSE = "ptcourse"
TOKEN = "workshop-test-token-" + os.urandom(8).hex()
STUDENTS = ("student1", "student2")
TIMINGS: dict[str, float] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, method: str = "GET", data: dict | None = None, body: bytes | None = None,
         timeout: float = 60) -> tuple[int, bytes]:  # fmt: skip
    """One request to the hub or a user's server, with the service's token."""
    if data is not None:
        body = urlencode(data).encode()
    request = Request(url, data=body, method=method)
    request.add_header("Authorization", f"token {TOKEN}")
    if data is not None:
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
    with urlopen(request, timeout=timeout) as reply:
        return reply.status, reply.read()


def until(what: str, check, seconds: float):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        time.sleep(0.5)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def workshop(tmp_path_factory, hub_tools):
    root = tmp_path_factory.mktemp("workshop")
    env = {
        **os.environ,
        "PTCOURSE_HUB_PORT": str(free_port()),
        "PTCOURSE_HUB_API_PORT": str(free_port()),
        "PTCOURSE_PROXY_API_PORT": str(free_port()),
        "PTCOURSE_HUB_STATE": str(root / "hub"),
        "PTCOURSE_HUB_SERVICE_TOKEN": TOKEN,
        "PTCOURSE_HUB_PASSWORD": os.urandom(8).hex(),
        "PTCOURSE_EXCHANGE": str(root / "exchange"),
        "PTCOURSE_BUILD": str(root / "build"),
        "PTCOURSE_SMOKE": "1",
        "PTCOURSE_CELL_TIMEOUT": "60",
        "JUPYTER_CONFIG_PATH": str(paths.ROOT / "deploy"),
    }
    hub_url = f"http://127.0.0.1:{env['PTCOURSE_HUB_PORT']}"
    log = (root / "hub.log").open("w")
    (root / "hub").mkdir()
    start = time.perf_counter()
    hub = subprocess.Popen(
        [sys.executable, "-m", "jupyterhub", "-f", str(paths.ROOT / "deploy/jupyterhub_config.py")],
        cwd=root / "hub", env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        until("the hub's API", lambda: call(f"{hub_url}/hub/api/")[0] == 200, 60)
        TIMINGS["hub start"] = time.perf_counter() - start
        yield {"root": root, "env": env, "hub": hub_url}
    finally:
        for student in STUDENTS:
            with contextlib.suppress(OSError):
                call(f"{hub_url}/hub/api/users/{student}/server", "DELETE", timeout=30)
        hub.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            hub.wait(30)
        with contextlib.suppress(ProcessLookupError):  # the proxy and servers left over
            os.killpg(hub.pid, signal.SIGKILL)
        hub.wait(10)
        log.close()
        print((root / "hub.log").read_text()[-3000:])
        print("workshop timings: " + ", ".join(f"{k} {v:.1f} s" for k, v in TIMINGS.items()))


def instructor(workshop, *command: str, timeout: float = 300) -> str:
    """An instructor's command, run from the repository (its nbgrader_config.py + deploy/'s)."""
    start = time.perf_counter()
    done = subprocess.run(
        list(command), cwd=paths.ROOT, env=workshop["env"], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    TIMINGS[" ".join(command[1:3])] = time.perf_counter() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout + done.stderr


def nbgrader(workshop, step: str, *args: str) -> str:
    tool = str(Path(sys.executable).with_name("nbgrader"))
    return instructor(workshop, tool, step, LAB, *args)


def start_server(workshop, student: str) -> str:
    hub = workshop["hub"]
    start = time.perf_counter()
    status, _ = call(f"{hub}/hub/api/users/{student}/server", "POST", body=b"")
    assert status in (201, 202), status

    def ready():
        user = json.loads(call(f"{hub}/hub/api/users/{student}")[1])
        return user["servers"].get("", {}).get("ready")

    until(f"{student}'s server", ready, 90)
    TIMINGS[f"{student}: server start"] = time.perf_counter() - start
    return f"{hub}/user/{student}"


def student_step(server: str, action: str) -> None:
    start = time.perf_counter()
    status, body = call(
        f"{server}/assignments/{action}", "POST", {"course_id": COURSE, "assignment_id": LAB}
    )
    reply = json.loads(body)
    assert status == 200 and reply["success"], reply
    TIMINGS[f"{server.rsplit('/', 1)[1]}: {action}"] = time.perf_counter() - start


def contents(server: str, path: str) -> dict:
    return json.loads(call(f"{server}/api/contents/{quote(path)}?content=1")[1])


def test_release_fetch_submit_collect_grade_feedback(workshop):
    nbgrader(workshop, "release_assignment", "--force")
    servers = {s: start_server(workshop, s) for s in STUDENTS}
    for server in servers.values():
        student_step(server, "fetch")
        fetched = contents(server, f"{LAB}/{LAB}.ipynb")
        assert fetched["type"] == "notebook"
    # student1 works the lab (the reference answer), student2 submits it untouched
    answer = json.loads(paths.notebook(paths.course_labs([LAB])[0]).read_text())
    put = json.dumps({"type": "notebook", "format": "json", "content": answer}).encode()
    call(f"{servers['student1']}/api/contents/{LAB}/{LAB}.ipynb", "PUT", body=put)
    for server in servers.values():
        student_step(server, "submit")

    nbgrader(workshop, "collect")
    submitted = workshop["root"] / "build" / "nbgrader" / "submitted"
    for student in STUDENTS:
        assert (submitted / student / LAB / f"{LAB}.ipynb").exists()
    graded = instructor(  # its per-submission seconds are in grades.json
        workshop, sys.executable, "-m", "ptcourse.course.cli", "grade", str(submitted), "00",
        "--timeout", "600", timeout=600,
    )  # fmt: skip
    print(graded)
    scores = json.loads((workshop["root"] / "build" / "grades" / "grades.json").read_text())
    by_student = {s["student"]: s for s in scores}
    for s in scores:
        TIMINGS[f"grading {s['student']}"] = s["seconds"]
    assert by_student["student1"]["auto_score"] == by_student["student1"]["auto_max"] > 0, scores
    assert by_student["student2"]["status"] == "graded", scores
    assert by_student["student2"]["auto_score"] == 0, scores
    nbgrader(workshop, "release_feedback")

    for student, server in servers.items():
        student_step(server, "fetch_feedback")
        folder = contents(server, f"{LAB}/feedback")["content"]
        assert folder, f"{student} fetched no feedback"
        html = contents(server, f"{folder[0]['path']}/{LAB}.html")["content"]
        (workshop["root"] / f"feedback-{student}.html").write_text(html)
        assert "[lab 00 · " in html, html[-2000:]
        # the judge's own verdict lines reach the student: full marks for one, none for the other
        verdict = "2/2 points" if student == "student1" else "0/2 points"
        assert f": {verdict}" in html, html[-2000:]
