"""Run an RSS probe script in a fresh Python (a clean heap), and read the JSON it prints last."""

import json
import subprocess
import sys

import pytest


def run_pinned(script: str) -> dict:
    """The probe's result; skips where glibc's thresholds cannot be pinned (not glibc)."""
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["pinned"]:
        pytest.skip("not glibc: RSS thresholds cannot be pinned")
    return result
