"""The versions the course was tested with (``constraints.txt``) against what is installed here.

The README's install commands pass ``-c constraints.txt`` to pip, and CI installs the same way, so
the test suite runs on exactly the pinned versions; ``tools/lock.py`` rewrites the file from a
venv that passed. ``ptcourse doctor`` shows the packages the labs' numbers depend on.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

CONSTRAINTS = Path(__file__).resolve().parents[2] / "constraints.txt"
# The packages whose versions change what the labs measure or how they are graded.
KEY_PACKAGES = (
    "torch",
    "torchvision",
    "numpy",
    "scipy",
    "onnx",
    "onnxscript",
    "onnxruntime",
    "torchao",
    "nvidia-dali-cuda120",
    "nbgrader",
    "papermill",
    "jupyterlab",
)


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares them: ``Jinja2`` is ``jinja2``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path: Path = CONSTRAINTS) -> dict[str, str]:
    """``name -> version`` of every ``name==version`` line of a constraints file."""
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep:
            raise ValueError(f"{path.name}: {line!r} is not an exact pin (name==version)")
        pins[canonical(name)] = version.split(";", 1)[0].strip()
    return pins


def installed(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class Version:
    name: str
    installed: str | None
    pinned: str | None

    @property
    def matches(self) -> bool:
        return self.installed is not None and self.installed == self.pinned

    def describe(self) -> str:
        have = self.installed or "not installed"
        if self.pinned is None:
            return f"{have} (not in constraints.txt)"
        if self.matches:
            return f"{have} (as pinned)"
        return f"{have} — constraints.txt pins {self.pinned}"


def key_versions(path: Path = CONSTRAINTS) -> list[Version]:
    """The key packages, installed against pinned (``pinned`` is None without a lock file)."""
    pins = pinned(path) if path.exists() else {}
    return [Version(name, installed(name), pins.get(name)) for name in KEY_PACKAGES]


def mismatches(path: Path = CONSTRAINTS) -> list[Version]:
    """Every pinned package that is installed here at another version."""
    found = []
    for name, version in pinned(path).items():
        have = installed(name)
        if have is not None and have != version:
            found.append(Version(name, have, version))
    return found


def report_lines(path: Path = CONSTRAINTS) -> list[str]:
    """``ptcourse doctor``'s section on versions."""
    if not path.exists():
        return ["Versions", f"  no {path.name} beside this package (installed from a wheel?)"]
    off = mismatches(path)
    summary = (
        f"every installed package as pinned in {path.name}"
        if not off
        else f"{len(off)} installed package(s) differ from {path.name}: results may differ "
        f"from the course's measurements (pip install -e . -c {path.name} restores them)"
    )
    lines = ["Versions", f"  {summary}"]
    lines += [f"  {v.name:<22}{v.describe()}" for v in key_versions(path)]
    return lines
