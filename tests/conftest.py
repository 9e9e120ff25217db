import subprocess
import sys

import pytest


@pytest.fixture
def busy_core():
    """Keep the other core busy, as a shared machine would."""
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        yield
    finally:
        hog.kill()
        hog.wait()
