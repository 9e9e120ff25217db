"""One `ptcourse grade` run shared by the tiers that compare grades.

The grading tier's submissions (every lab's reference, blank and variants from
``tests/integration/submissions``) and the adversarial slice's attacks
(``tests/adversarial/attacks.py``) are graded together, two lanes, one queue: an attack is
compared with the honest base it was made from (the grading tier's "reference", "baseline" or
"blank") graded in the same run, and a looper's minutes of timeouts overlap other submissions
instead of leaving a core idle. The run happens once per test session: the first module that
needs it grades (holding the whole machine), later ones read its result.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from ptcourse.core.lineup import lab
from ptcourse.course import autograde, paths

MARKER = "ptcourse-adversary-8d1f"  # in the command line of every process an attack leaves
# Two lanes, each judge and its workers pinned to one core (`ptcourse grade --lanes 2`): every
# submission is graded on one core beside a busy neighbour, as on a 2-core student machine
# running something else; the 2-core, one-lane configuration is tests/integration/test_matrix.py's.
LANES = "2"
# A cell's time limit: above the slowest cell of a reference, baseline copy or blank on the
# slowest machine class (Lab 12's compiled quick test: 28 s on the Intel AMX VM, 2026-12-07).
CELL_TIMEOUT_S = "60"


def variants() -> dict:
    sys.path.insert(0, str(paths.ROOT / "tests" / "integration"))
    from submissions import VARIANTS

    return VARIANTS


def slice_attacks() -> list:
    """The attacks graded in the shared run: the slice CI runs, unless ``PTCOURSE_ADVERSARIAL``
    asks for others (the adversarial tier then grades those in a run of its own)."""
    if os.environ.get("PTCOURSE_ADVERSARIAL"):
        return []
    sys.path.insert(0, str(paths.ROOT / "tests" / "adversarial"))
    from attacks import ATTACKS

    return [attack for attack in ATTACKS if attack.in_slice]


def with_replacements(nb: dict, replacements: dict[str, str]) -> dict:
    nb = copy.deepcopy(nb)
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in replacements:
            cell["source"] = replacements[grade_id]
    return nb


def base(key: str, name: str) -> dict:
    """The notebook of an honest base: "blank" (the student version), "reference" (the
    solution) or a variant's name ("baseline": the lab's baseline in every exercise)."""
    the_lab = lab(key)
    if name == "blank":
        return json.loads(paths.notebook(the_lab, "labs").read_text())
    nb = json.loads(paths.notebook(the_lab).read_text())
    if name == "reference":
        return nb
    return with_replacements(nb, variants()[the_lab.name]["students"][name])


def _code(source: str) -> dict:
    return {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
            "source": source}  # fmt: skip


def with_attack(nb: dict, attack) -> dict:
    """``nb`` with the attack's cells after the locked setup and before the first hidden test,
    and a note first where the attack is an honest variation."""
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


def write(folder: Path, student: str, key: str, nb: dict, files: dict | None = None) -> None:
    target = folder / student / lab(key).name
    target.mkdir(parents=True, exist_ok=True)
    (target / f"{lab(key).name}.ipynb").write_text(json.dumps(nb))
    for name, text in (files or {}).items():
        (target / name).write_text(text)


def course_fingerprint() -> str:
    digest = hashlib.sha256()
    for folder in ("ptcourse", "solutions", "labs"):
        for path in sorted((paths.ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(path.read_bytes())
    return digest.hexdigest()


def grade(root: Path, keys: list[str], env: dict[str, str]) -> dict:
    """``ptcourse grade`` of ``root/submissions`` (labs ``keys``); its scores by (student,
    lab), the course's fingerprint before and after, and what attacks left running."""
    before = course_fingerprint()
    env = {**os.environ, "PTCOURSE_SMOKE": "1", "PTCOURSE_BUILD": str(root / "build"), **env}
    command = [sys.executable, "-m", "ptcourse.course.cli", "grade", str(root / "submissions")]
    command += [*keys, "--timeout", "900", "--lanes", LANES]
    done = subprocess.run(
        command, cwd=paths.ROOT, env=env, capture_output=True, text=True, timeout=3600
    )
    print(done.stdout)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert (root / "build" / "grades" / "grades.csv").exists()
    leftovers = subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout
    scores = json.loads((root / "build" / "grades" / "grades.json").read_text())
    for score in scores:
        score["verdicts"] = verdicts(root / "build", score["student"], score["lab"])
    return {
        "scores": {f"{s['student']}/{s['lab']}": s for s in scores},
        "before": before,
        "after": course_fingerprint(),
        "leftovers": leftovers,
    }


def verdicts(build: Path, student: str, lab_name: str) -> list[str]:
    """The judge's lines in the judged notebook (``[lab NN · check] ...`` and the reference's
    ratio beside a speed verdict): what a failed grade assertion shows."""
    lines = []
    for path in (build / "judge" / "submitted" / student / lab_name).glob("*.ipynb"):
        for cell in json.loads(path.read_text())["cells"]:
            for output in cell.get("outputs", []):
                text = output.get("text", "")
                text = "".join(text) if isinstance(text, list) else text
                lines += [line for line in text.splitlines() if line.startswith(("[lab", "  "))]
    return lines


def course_grades(root: Path, keys: list[str], attacks: list) -> dict:
    """The shared run: every lab in ``keys`` with its variants, and ``attacks``."""
    submissions = root / "submissions"
    labs = sorted({*keys, *(a.lab for a in attacks)})
    for key in labs:
        the_lab = lab(key)
        autograde.copy_submission(paths.notebook(the_lab), submissions, "reference", the_lab)
        autograde.copy_submission(paths.notebook(the_lab, "labs"), submissions, "blank", the_lab)
        for student in variants().get(the_lab.name, {}).get("students", {}):
            write(submissions, student, key, base(key, student))
    for attack in attacks:
        nb = with_attack(base(attack.lab, attack.base), attack)
        write(submissions, attack.name, attack.lab, nb, attack.files)
    result = grade(root, labs, {"PTCOURSE_CELL_TIMEOUT": CELL_TIMEOUT_S})
    write_times(result["scores"])
    return result


def write_times(scores: dict) -> None:
    """Every submission's score and judging time, kept in the build folder (the run's own
    folders are temporary): what grading costs per submission, lab by lab."""
    lines = ["| submission | lab | score | judged in |", "|---|---|---|---|"]
    for s in sorted(scores.values(), key=lambda s: (s["lab"], s["student"])):
        score = f"{s['auto_score']:g}/{s['auto_max']:g}" if s["status"] == "graded" else s["status"]
        lines.append(f"| {s['student']} | {s['lab']} | {score} | {s['seconds']:.0f} s |")
    folder = paths.BUILD / "grading"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "last.md").write_text("\n".join(lines) + "\n")


def shared(folder: Path, compute) -> dict:
    """``compute(folder)`` once per test session, whichever module asks first; later calls (in
    this worker or the other) read the result it saved in ``folder``. Call it holding the whole
    machine."""
    result = folder / "result.json"
    if not result.exists():
        folder.mkdir(parents=True, exist_ok=True)
        result.write_text(json.dumps(compute(folder)))
    return json.loads(result.read_text())
