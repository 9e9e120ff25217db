from pathlib import Path

import pytest

from ptcourse import labs
from ptcourse.core.lineup import LABS
from ptcourse.grading import targets

ROOT = Path(__file__).resolve().parents[3]
ROWS = labs.all_targets()


def test_every_written_lab_has_rows():
    written = {each.number for each in LABS if (ROOT / "solutions" / each.name).exists()}
    assert {row.lab for row in ROWS} == written


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.lab}-{r.check}-{r.track}")
def test_row_has_cpu_fallback_reference_and_provenance(row):
    assert targets.pick(labs.module(row.lab).TARGETS, row.check, "cpu").track == "cpu"
    assert row.reference and row.baseline and row.measured_on and row.measured
    assert row.kind in targets.HIGHER_IS_BETTER + targets.LOWER_IS_BETTER


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.lab}-{r.check}-{r.track}")
def test_row_leaves_room_for_partial_credit(row):
    assert row.target != row.floor
    assert (row.target > row.floor) == row.higher_is_better


@pytest.mark.parametrize("row", ROWS, ids=lambda r: f"{r.lab}-{r.check}-{r.track}")
def test_row_cites_only_files_in_this_repository(row):
    if row.script:  # a command: the script's path, then options it must accept
        path, *options = row.script.split()
        assert (ROOT / path).is_file(), f"{path} does not exist"
        for option in options:
            assert option in (ROOT / path).read_text(), f"{path} has no option {option}"
    text = " ".join((row.reference, row.baseline, row.measured_on))
    for word in ("FACTS.md", "/work/notes", "authoring task", "the seed"):
        assert word not in text, f"{row.lab} {row.check}: cites {word!r}, not in this repository"


def test_pick_falls_back_to_the_cpu_row():
    row = targets.Target("99", "x", "cpu", "speedup", 2.0, 1.2, "r", "b", "m", "d")
    assert targets.pick([row], "x", "cuda") is row
    with pytest.raises(KeyError):
        targets.pick([row], "y", "cpu")


def test_table_markdown_lists_every_row():
    assert len(targets.table_markdown(ROWS).splitlines()) == 2 + len(ROWS)
