"""The adversarial tier: every attack in ``attacks.py`` graded by ``ptcourse grade`` beside its
honest base, in one run. An attack earns no more than its base, cell by cell; an honest
variation exactly what its base earns; every submission's grading completes; nothing an attack
started outlives the run; the course's files are untouched.

CI runs the slice marked ``in_slice``; ``PTCOURSE_ADVERSARIAL=all pytest tests/adversarial``
runs every attack (docs/grading.md lists the last full run's table), and
``PTCOURSE_ADVERSARIAL=name,name`` the attacks named.
"""

import copy
import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest
from attacks import ATTACKS, MARKER

from ptcourse.core.lineup import lab
from ptcourse.course import paths

pytestmark = [pytest.mark.grading, pytest.mark.whole_machine]  # two lanes

_ASKED = os.environ.get("PTCOURSE_ADVERSARIAL", "")
CHOSEN = [
    a
    for a in ATTACKS
    if _ASKED == "all" or a.name in _ASKED.split(",") or (not _ASKED and a.in_slice)
]
SLOW_SPEED = {"06": ["test_speed_hidden", "test_memory_hidden"], "09": ["test_fix_speed_hidden"]}


def _variants():
    sys.path.insert(0, str(paths.ROOT / "tests" / "integration"))
    from submissions import VARIANTS

    return VARIANTS


def _base(key: str, base: str) -> dict:
    the_lab = lab(key)
    if base == "blank":
        return json.loads(paths.notebook(the_lab, "labs").read_text())
    nb = json.loads(paths.notebook(the_lab).read_text())
    if base == "baseline":
        replacements = _variants()[the_lab.name]["students"]["baseline"]
        for cell in nb["cells"]:
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if grade_id in replacements:
                cell["source"] = replacements[grade_id]
    return nb


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": source}  # fmt: skip


def _with_attack(nb: dict, attack) -> dict:
    nb = copy.deepcopy(nb)
    cells = nb["cells"]
    grade_ids = [c["metadata"].get("nbgrader", {}).get("grade_id", "") for c in cells]
    after_setup = max(i for i, g in enumerate(grade_ids) if g in ("setup", "parameters", "sizes"))
    hidden = [i for i, g in enumerate(grade_ids) if g.endswith("_hidden")]
    first_hidden = hidden[0] if hidden else len(cells)
    for source in reversed(attack.end):
        cells.insert(first_hidden, _code(source))
    for source in reversed(attack.start):
        cells.insert(after_setup + 1, _code(source))
    if attack.honest:
        cells.insert(0, {"cell_type": "markdown", "metadata": {}, "source": "My own notes."})
    return nb


def _write(folder, student, the_lab, nb, files=None):
    target = folder / student / the_lab.name
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{the_lab.name}.ipynb").write_text(json.dumps(nb))
    for name, text in (files or {}).items():
        (target / name).write_text(text)


def _course_fingerprint() -> str:
    digest = hashlib.sha256()
    for folder in ("ptcourse", "solutions", "labs"):
        for path in sorted((paths.ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("adversarial")
    submissions = root / "submissions"
    for key, base in {(a.lab, a.base) for a in CHOSEN}:
        _write(submissions, f"base-{base}", lab(key), _base(key, base))
    for attack in CHOSEN:
        nb = _with_attack(_base(attack.lab, attack.base), attack)
        _write(submissions, attack.name, lab(attack.lab), nb, attack.files)
    before = _course_fingerprint()
    env = {
        **os.environ,
        "PTCOURSE_SMOKE": "1",
        "PTCOURSE_CELL_TIMEOUT": "30",
        "PTCOURSE_MEMORY_LIMIT_GB": "6",
        "PTCOURSE_BUILD": str(root / "build"),
    }
    keys = sorted({a.lab for a in CHOSEN})
    command = [sys.executable, "-m", "ptcourse.course.cli", "grade", str(submissions), *keys]
    command += ["--lanes", "2"]  # each submission on one core beside a busy neighbour
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    leftovers = subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout
    scores = json.loads((root / "build" / "grades" / "grades.json").read_text())
    return {(s["student"], s["lab"]): s for s in scores}, before, leftovers


@pytest.mark.parametrize("attack", CHOSEN, ids=lambda a: a.name)
def test_an_attack_earns_no_more_than_its_honest_code(attack, graded):
    scores, _, _ = graded
    name = lab(attack.lab).name
    got, base = scores[(attack.name, name)], scores[(f"base-{attack.base}", name)]
    assert got["status"] == base["status"] == "graded", (got["detail"], base["detail"])
    for cell, deserved in base["cells"].items():
        earned = got["cells"].get(cell, 0.0)
        if attack.honest and cell in SLOW_SPEED.get(attack.lab, ()):
            assert earned >= 0.8 * deserved, (cell, earned, deserved)  # timing noise
        elif attack.honest:
            assert earned == deserved, (cell, earned, deserved)
        else:
            assert earned <= deserved, (cell, earned, deserved, got["cells"])


def test_nothing_an_attack_started_outlives_grading(graded):
    _, _, leftovers = graded
    assert leftovers.strip() == "", f"processes left behind: {leftovers}"


def test_the_course_is_untouched(graded):
    _, before, _ = graded
    unsandboxed = "" if shutil.which("bwrap") else " (no sandbox: bubblewrap is not installed)"
    assert _course_fingerprint() == before, f"a submission changed the course's files{unsandboxed}"
