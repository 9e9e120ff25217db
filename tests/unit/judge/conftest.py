import pytest
from judged import readable

from ptcourse.course.paths import BUILD
from ptcourse.judge import sandbox
from ptcourse.judge.remote import WorkerProcess

NO_SANDBOX = sandbox.unavailable()


@pytest.fixture
def make_worker(tmp_path):
    """Start sandboxed workers on a submission folder holding ``files``; all killed afterwards."""
    started = []

    def start(files: dict[str, str] | None = None, sandboxed: bool = True, **limits):
        submission = tmp_path / "submissions" / "student" / "lab"
        submission.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():
            (submission / name).write_text(text)
        if sandboxed and NO_SANDBOX:
            pytest.skip(NO_SANDBOX)
        worker = WorkerProcess(
            submission,
            tmp_path / "scratch",
            {"PTCOURSE_SMOKE": "1"},
            readable(),
            [BUILD, tmp_path / "submissions"],
            limits=sandbox.Limits(**limits),
            sandboxed=sandboxed,
        ).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.kill()
