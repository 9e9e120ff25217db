"""One configuration of the grading matrix (``tools/grading_matrix.py``): Lab 03 graded as on an
AVX2-only machine (ATen and oneDNN capped at AVX2 on whatever CPU this is). The reference keeps
full marks (bf16 speed is not gradable there: its points grade autocast in effect), a baseline
copy scores 0 on the speed checks, a blank notebook 0. The full matrix is a documented command."""

import json
import os
import subprocess
import sys

import pytest
from labs_under_test import selected_labs

from ptcourse.course import paths

pytestmark = pytest.mark.grading


@pytest.mark.skipif(
    bool(selected_labs()) and "03" not in selected_labs(), reason="PTCOURSE_TEST_LABS excludes 03"
)
def test_lab03_verdicts_hold_on_an_avx2_machine(tmp_path):
    env = {**os.environ, "PTCOURSE_BUILD": str(tmp_path / "build")}
    command = [
        sys.executable,
        "tools/grading_matrix.py",
        "--labs",
        "03",
        "--configs",
        "avx2-machine",
    ]
    done = subprocess.run(command, cwd=paths.ROOT, env=env, capture_output=True, text=True)
    table = json.loads((tmp_path / "build" / "matrix" / "matrix.json").read_text())
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert all("ok" in v for v in table["avx2-machine"]["03-mixed-precision"].values()), table
