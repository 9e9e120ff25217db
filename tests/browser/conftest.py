"""The browser tier: JupyterLab on localhost driven by headless Chromium (playwright)."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "browser: drives JupyterLab in headless Chromium (needs chromium, playwright)"
    )


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def browser_page(shots: Path) -> Iterator[object]:
    """A playwright page in headless Chromium, closed after the test."""
    executable = chromium_path()
    if executable is None:
        pytest.skip("browser tier skipped: no 'chromium' executable on PATH (apt install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(60_000)
            yield page
        finally:
            browser.close()


@pytest.fixture
def shots() -> Path:
    from ptcourse.course.paths import BUILD

    folder = BUILD / "browser"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def jupyter_lab(tmp_path: Path) -> Iterator[str]:
    """JupyterLab (as `ptcourse lab` starts it, smoke size) on a copy of labs/; yields its URL."""
    from ptcourse.assets import datasets
    from ptcourse.course.paths import ROOT

    for name in ("inspection", "headlines"):
        datasets.ensure(name, smoke=True)
    labs = tmp_path / "labs"
    shutil.copytree(ROOT / "labs", labs)
    port, token = free_port(), secrets.token_hex(16)
    jupyter = Path(sys.executable).parent / "jupyter"
    settings = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)  # no "get notified about Jupyter news?" toast over the shots
    (settings / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
    env = {
        **os.environ,
        "PTCOURSE_SMOKE": "1",
        "PTCOURSE_BUILD": str(tmp_path / "build"),  # the learner's checks and progress
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTERLAB_SETTINGS_DIR": str(tmp_path / "settings"),
    }
    command = [
        str(jupyter), "lab", str(labs), "--no-browser", "--allow-root", f"--port={port}",
        "--ServerApp.ip=127.0.0.1", f"--IdentityProvider.token={token}",
        "--LabApp.expose_app_in_browser=True",
    ]  # fmt: skip
    log = open(tmp_path / "jupyter.log", "wb")  # noqa: SIM115 — closed in the finally below
    server = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError((tmp_path / "jupyter.log").read_text()[-3000:]) from None
                time.sleep(0.5)
        yield f"{url}/lab?token={token}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
        log.close()
