"""binder/: repo2docker's postBuild and start scripts, run as a Binder launch runs them, in a
fresh venv (repo2docker itself needs Docker, which these machines do not have). The packages
come from the test venv through a .pth file, so pip checks the pins and installs only the course:
what is tested is the scripts, the constraints and the datasets step, not the download."""

import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from ptcourse.course import paths

BINDER = paths.ROOT / "binder"


@pytest.fixture(scope="module")
def binder_venv(tmp_path_factory):
    venv = tmp_path_factory.mktemp("binder") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = Path(sysconfig.get_paths(vars={"base": str(venv)})["purelib"])
    (site / "ptcourse-test-venv.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # repo2docker puts its environment first on PATH; postBuild calls `pip` and `ptcourse`.
    (venv / "bin" / "pip").write_text(f'#!/bin/sh\nexec "{venv}/bin/python" -m pip "$@"\n')
    (venv / "bin" / "pip").chmod(0o755)
    return venv


def run_in(venv, *command, **kwargs):
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PTCOURSE_SMOKE")}
    env["PATH"] = f"{venv}/bin:/usr/bin:/bin"
    return subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=900, **kwargs
    )


def test_the_runtime_is_a_python_the_course_supports():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime.startswith("python-")
    pyproject = (paths.ROOT / "pyproject.toml").read_text()
    low = re.search(r'requires-python = ">=([0-9.]+)"', pyproject).group(1)
    version = tuple(map(int, runtime.removeprefix("python-").split(".")))
    assert version >= tuple(map(int, low.split(".")))


def test_post_build_installs_the_course_with_the_pins_and_builds_the_smoke_data(binder_venv):
    done = run_in(binder_venv, "bash", str(BINDER / "postBuild"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "inspection" in done.stdout and "verified" in done.stdout
    check = run_in(binder_venv, "ptcourse", "doctor")
    assert check.returncode == 0, check.stderr[-2000:]
    assert "every installed package as pinned in constraints.txt" in check.stdout


def test_start_runs_the_labs_at_smoke_size_unless_told_otherwise(binder_venv):
    probe = ["python", "-c", "from ptcourse.core.smoke import is_smoke; print(is_smoke())"]
    assert run_in(binder_venv, "bash", str(BINDER / "start"), *probe).stdout.strip() == "True"


def test_the_readme_badge_opens_lab_00_of_this_repository():
    """The Binder badge launches the repository pyproject.toml names, at Lab 00's notebook."""
    from urllib.parse import parse_qs, unquote, urlparse

    readme = (paths.ROOT / "README.md").read_text()
    link = re.search(r"\(https://mybinder\.org/v2/gh/([^)]+)\)", readme)
    assert link, "no Binder badge in the README"
    url = urlparse("https://mybinder.org/v2/gh/" + link.group(1))
    owner, name = url.path.split("/")[3:5]
    repository = re.search(r'Repository = "([^"]+)"', (paths.ROOT / "pyproject.toml").read_text())
    assert repository and repository.group(1) == f"https://github.com/{owner}/{name}"
    target = unquote(parse_qs(url.query)["labpath"][0])
    assert target == "labs/00-measuring-right/00-measuring-right.ipynb"
    assert (paths.ROOT / target).is_file()
