"""Every lab module follows the contract of ``ptcourse.labs``, and every hidden test cell of its
notebook is a few lines that call one of the module's checks."""

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

from ptcourse import labs
from ptcourse.core import lineup
from ptcourse.grading.targets import Target

ROOT = Path(__file__).resolve().parents[3]
WRITTEN = [each for each in lineup.LABS if (ROOT / "solutions" / each.name).exists()]
MAX_HIDDEN_LINES = 6  # between the markers, blank lines included


def lab_module(each):
    return labs.module(each.number)


def hidden_cells(each):
    notebook = ROOT / "solutions" / each.name / f"{each.name}.ipynb"
    for cell in json.loads(notebook.read_text())["cells"]:
        source = "".join(cell["source"])
        if "### BEGIN HIDDEN TESTS" in source:
            yield cell["metadata"]["nbgrader"]["grade_id"], source


def check_name(grade_id: str) -> str:
    return "check_" + grade_id.removeprefix("test_").removesuffix("_hidden")


@pytest.mark.parametrize("each", WRITTEN, ids=lambda x: x.name)
def test_module_has_the_contract(each):
    module = lab_module(each)
    assert each == module.LAB
    assert module.TARGETS and all(isinstance(row, Target) for row in module.TARGETS)
    assert {row.lab for row in module.TARGETS} == {each.number}
    assert dataclasses.is_dataclass(module.Sizes) and module.Sizes.__dataclass_params__.frozen
    assert isinstance(module.sizes(), module.Sizes)
    assert any(name.startswith("baseline") for name in vars(module)), "a baseline…"


@pytest.mark.parametrize("each", WRITTEN, ids=lambda x: x.name)
def test_every_hidden_cell_calls_one_check(each):
    module = lab_module(each)
    for grade_id, source in hidden_cells(each):
        name = check_name(grade_id)
        check = getattr(module, name, None)
        assert callable(check), f"{each.module} has no {name} for hidden cell {grade_id}"
        assert "points" in inspect.signature(check).parameters, f"{name}(answer, *, points)"
        body = source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
        lines = body.strip("\n").splitlines()
        assert len(lines) <= MAX_HIDDEN_LINES, f"{grade_id}: {len(lines)} lines of hidden code"
        assert f'fresh("{each.number}").{name}(' in body, f"{grade_id} must call {name}"


@pytest.mark.parametrize("each", WRITTEN, ids=lambda x: x.name)
def test_every_check_has_a_hidden_cell(each):
    module = lab_module(each)
    cells = {check_name(grade_id) for grade_id, _ in hidden_cells(each)}
    checks = {name for name in vars(module) if re.fullmatch(r"check_\w+", name)}
    assert checks == cells
