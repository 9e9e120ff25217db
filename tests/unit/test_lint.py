"""ruff: lint and format of the package, the tests and tools/; lint of the solution notebooks
(labs/ is generated from them)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ["ptcourse", "tests", "tools"]


def ruff(*args):
    command = [sys.executable, "-m", "ruff", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True)


def test_ruff_lint_is_clean():
    done = ruff("check", *PYTHON, "solutions")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    done = ruff("format", "--check", *PYTHON)
    assert done.returncode == 0, done.stdout + done.stderr
