import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def ruff(*args):
    return subprocess.run(
        [sys.executable, "-m", "ruff", *args, "ptcourse", "tests"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )


def test_ruff_lint_is_clean():
    done = ruff("check")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_format_is_clean():
    done = ruff("format", "--check")
    assert done.returncode == 0, done.stdout + done.stderr
