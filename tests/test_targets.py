from ptcourse import targets
from ptcourse.labs import LABS


def test_every_target_has_cpu_row_reference_and_provenance():
    for row in targets.TARGETS:
        assert targets.target(row.lab, row.check, "cpu").track == "cpu"
        assert row.reference and row.baseline and row.measured_on and row.measured
        assert row.kind in targets.HIGHER_IS_BETTER + targets.LOWER_IS_BETTER


def test_targets_leave_room_for_partial_credit():
    for row in targets.TARGETS:
        goal, floor = row.target, row.floor
        assert goal != floor
        assert (goal > floor) == row.higher_is_better


def test_targets_name_known_labs():
    numbers = {each.number for each in LABS}
    assert {row.lab for row in targets.TARGETS} <= numbers


def test_table_markdown_lists_every_row():
    assert len(targets.table_markdown().splitlines()) == 2 + len(targets.TARGETS)
