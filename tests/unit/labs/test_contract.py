"""Every lab module follows the contract of ``ptcourse.labs``, and every hidden test cell of its
notebook is a few lines that call one of the module's checks."""

import ast
import dataclasses
import inspect
import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from ptcourse import labs
from ptcourse.core import lineup
from ptcourse.grading.targets import Target

ROOT = Path(__file__).resolve().parents[3]
WRITTEN = [each for each in lineup.LABS if (ROOT / "solutions" / each.name).exists()]
MAX_HIDDEN_LINES = 6  # between the markers, blank lines included
# The grading contract, assigned right after the imports: always, and where the lab has them.
CONTRACT = ("LAB", "JUDGED", "TARGETS")
CONTRACT_IF_PRESENT = ("VOUCHED", "MEASURE", "SCRIPT", "RUNS")
CHECKS_HEADER = "# The checks"
SEPARATOR = "# ---"


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


def module_source(each):
    """The path (relative to the repository), source and syntax tree of ``each``'s module, read
    from disk (not imported)."""
    path = ROOT / (each.module.replace(".", "/") + ".py")
    source = path.read_text()
    return path.relative_to(ROOT), source, ast.parse(source)


def column_zero_comments(source: str) -> dict[int, str]:
    """Line number -> text of every comment that starts a line (not inside a string)."""
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return {t.start[0]: t.string for t in tokens if t.type == tokenize.COMMENT and t.start[1] == 0}


def assigned_at(tree: ast.Module) -> dict[str, int]:
    """Name -> line of its first top-level assignment."""
    found: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for name in (n for target in targets for n in ast.walk(target)):
                if isinstance(name, ast.Name):
                    found.setdefault(name.id, node.lineno)
    return found


def first_line(node: ast.stmt) -> int:
    """Where a statement starts, its decorators included."""
    return min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])


@pytest.mark.parametrize("each", WRITTEN, ids=lambda x: x.name)
def test_module_reads_in_the_fixed_order(each):
    """Every lab module reads the same way from the top: the imports; the contract (``LAB``,
    ``JUDGED``, ``VOUCHED``, ``MEASURE``/``SCRIPT``/``RUNS``, ``TARGETS``) before any def or
    class; everything the notebook uses; last, below one ``# The checks`` header, every
    ``check_<id>`` and the helpers only the checks use."""
    path, source, tree = module_source(each)
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    first = min(defs, key=first_line)
    assigned = assigned_at(tree)
    for name in CONTRACT + CONTRACT_IF_PRESENT:
        if name not in assigned:
            assert name not in CONTRACT, f"{path}: no top-level {name} (see ptcourse/labs)"
            continue
        assert assigned[name] < first_line(first), (
            f"{path}: {name} is assigned at line {assigned[name]}, after the first def/class "
            f"({first.name}, line {first_line(first)}): move it (with its comments and the "
            "constants TARGETS needs) up into the contract block right after the imports"
        )

    comments = column_zero_comments(source)
    headers = [line for line, text in comments.items() if text.startswith(CHECKS_HEADER)]
    assert len(headers) == 1, (
        f"{path}: {len(headers)} comment lines start with {CHECKS_HEADER!r} (lines {headers}); "
        f"the module needs exactly one: a {SEPARATOR}-line, then {CHECKS_HEADER!r} (reword any "
        "other comment that starts that way, e.g. the one above JUDGED)"
    )
    (header,) = headers
    assert comments.get(header - 1, "").startswith(SEPARATOR), (
        f"{path}: line {header - 1}, above the {CHECKS_HEADER!r} header, must be a {SEPARATOR} "
        "separator line, as every section header has"
    )
    for node in defs:
        if node.name.startswith("check_"):
            assert first_line(node) > header, (
                f"{path}: {node.name} (line {first_line(node)}) is above the {CHECKS_HEADER!r} "
                f"header (line {header}): move it below, with the helpers only the checks use"
            )
    later = [
        line for line, text in comments.items() if line > header and text.startswith(SEPARATOR)
    ]
    assert not later, (
        f"{path}: {SEPARATOR} separator lines after the {CHECKS_HEADER!r} header (lines {later}): "
        "the checks section is the module's last; move what the notebook uses above the header, "
        "and keep sub-titles among the checks as plain comments, without a separator"
    )
