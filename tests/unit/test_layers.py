"""The package's layers: each imports only from the layers below it; lab modules are independent;
notebooks never import the course tooling."""

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ptcourse"
LAYERS = ("core", "assets", "grading", "labs", "judge", "course")  # lowest first


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "ptcourse" and parts[1] in LAYERS else None


def imported_modules(tree: ast.AST) -> set[str]:
    """Every ptcourse module a source imports, at any depth (function-level imports included)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module":
            first = node.args[0] if node.args else None  # importlib.import_module("ptcourse.x")
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.add(first.value)
    return {name for name in found if name.startswith("ptcourse")}


def package_modules():
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(ROOT).with_suffix("")
        yield ".".join(relative.parts).removesuffix(".__init__"), path


def test_every_module_sits_in_a_layer():
    stray = [name for name, _ in package_modules() if name != "ptcourse" and not layer_of(name)]
    assert not stray, f"modules outside core/assets/grading/labs/course: {stray}"


@pytest.mark.parametrize("name,path", list(package_modules()), ids=lambda x: str(x))
def test_imports_only_from_lower_layers(name, path):
    own = layer_of(name)
    if own is None:
        return
    for target in imported_modules(ast.parse(path.read_text())):
        other = layer_of(target)
        if other is None:
            continue
        assert LAYERS.index(other) <= LAYERS.index(own), f"{name} imports {target}"
        if own == other == "labs" and name != "ptcourse.labs" and target != "ptcourse.labs":
            assert target == name, f"lab module {name} imports another lab's module {target}"


def test_notebooks_never_import_the_course_tooling():
    for notebook in sorted((ROOT / "solutions").glob("*/*.ipynb")):
        for cell in json.loads(notebook.read_text())["cells"]:
            if cell["cell_type"] == "code":
                assert "ptcourse.course" not in "".join(cell["source"]), notebook.name
