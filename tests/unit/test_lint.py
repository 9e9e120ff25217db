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


def test_ruff_reaches_every_layer_and_notebook():
    """An exclude pattern such as "labs" would silently skip ptcourse/labs and tests/unit/labs."""
    shown = ruff("check", "--show-files", *PYTHON, "solutions").stdout
    for path in (
        "ptcourse/labs/lab06_attention.py",
        "tests/unit/labs/test_contract.py",
        "tools/measure/lab03_mixed_precision.py",
        "solutions/06-attention/06-attention.ipynb",
    ):
        assert str(ROOT / path) in shown, f"ruff does not check {path}"
    assert str(ROOT / "labs" / "06-attention") not in shown, "labs/ is generated, not linted"
