"""The adversarial tier: every attack in ``attacks.py`` graded by ``ptcourse grade`` beside its
honest base, in one run. An attack earns no more than its base, cell by cell; an honest
variation exactly what its base earns; every submission's grading completes; nothing an attack
started outlives the run; the course's files are untouched.

CI runs the slice marked ``in_slice``, graded in the session's shared grading run beside the
grading tier's bases (``tests/grading_run.py``); ``PTCOURSE_ADVERSARIAL=all pytest
tests/adversarial`` runs every attack in a run of its own (docs/grading.md lists the last full
run's table), and ``PTCOURSE_ADVERSARIAL=name,name`` the attacks named.
"""

import os
import shutil

import grading_run
import pytest
from attacks import ATTACKS

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


def write_table(graded: dict) -> str:
    """The run's table (attack | lab | base | earned | deserved), kept in the build folder for
    docs/grading.md and the closing notes (the run's own folders are temporary)."""
    lines = ["| attack | lab | base | points earned | points deserved (its base) | judged in |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for attack in CHOSEN:
        name = lab(attack.lab).name
        got = graded["scores"].get(f"{attack.name}/{name}", {})
        base = graded["scores"].get(f"{attack.base}/{name}", {})
        earned, deserved = (
            f"{s.get('auto_score', '?')}/{s.get('auto_max', '?')}" for s in (got, base)
        )
        seconds = f"{got.get('seconds', 0):.0f} s"
        lines.append(
            f"| {attack.name} | {attack.lab} | {attack.base} | {earned} | {deserved} | {seconds} |"
        )
    table = "\n".join(lines) + "\n"
    folder = paths.BUILD / "adversarial"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / ("all.md" if _ASKED == "all" else "last.md")).write_text(table)
    return table


@pytest.fixture(scope="module")
def graded(request, tmp_path_factory):
    if not _ASKED:  # the slice: graded with the grading tier's submissions
        result = request.getfixturevalue("course_grades")
        write_table(result)
        return result
    root = tmp_path_factory.mktemp("adversarial")
    for key, base in {(a.lab, a.base) for a in CHOSEN}:
        grading_run.write(root / "submissions", base, key, grading_run.base(key, base))
    for attack in CHOSEN:
        nb = grading_run.with_attack(grading_run.base(attack.lab, attack.base), attack)
        grading_run.write(root / "submissions", attack.name, attack.lab, nb, attack.files)
    env = {"PTCOURSE_CELL_TIMEOUT": "30", "PTCOURSE_MEMORY_LIMIT_GB": "6"}
    result = grading_run.grade(root, sorted({a.lab for a in CHOSEN}), env)
    print(write_table(result))
    return result


@pytest.mark.parametrize("attack", CHOSEN, ids=lambda a: a.name)
def test_an_attack_earns_no_more_than_its_honest_code(attack, graded):
    name = lab(attack.lab).name
    got = graded["scores"][f"{attack.name}/{name}"]
    base = graded["scores"][f"{attack.base}/{name}"]
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
    assert graded["leftovers"].strip() == "", f"processes left behind: {graded['leftovers']}"


def test_the_course_is_untouched(graded):
    unsandboxed = "" if shutil.which("bwrap") else " (no sandbox: bubblewrap is not installed)"
    assert graded["after"] == graded["before"], (
        f"a submission changed the course's files{unsandboxed}"
    )
