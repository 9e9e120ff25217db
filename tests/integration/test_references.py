"""No dead ends: every "section N" a notebook cites is a numbered section of its lab (or of the
lab it names, "lab 04, section 2"), exercise headings are numbered in the order they come, and
every repository file a notebook cites exists."""

import importlib
import json
import re

import pytest
from labs_under_test import selected_labs

from ptcourse.core.lineup import lab as lab_named
from ptcourse.course import paths

LABS = paths.course_labs(selected_labs())
SECTION_HEADING = re.compile(r"^#+\s+(\d+)\.\s", re.MULTILINE)
SECTION_CITED = re.compile(r"(?:\b[Ll]ab (\d\d),? )?\b[Ss]ection (\d+)")
EXERCISE_HEADING = re.compile(r"^#+\s+Exercise\s+(\d+|[A-Z])\b", re.MULTILINE)
TOP = "ptcourse|tools|docs|tests|datasets|solutions|labs"  # a path in this repository, not a URL's
FILE_CITED = re.compile(rf"(?<![/\w.-])(?:{TOP})/[\w/.-]+\.\w+")
SHARED_NOTES = re.compile(r"\b(?:FACTS|DESIGN)\.md\b")


def sources(key: str) -> list[tuple[int, str]]:
    nb = json.loads(paths.notebook(lab_named(key)).read_text())
    return [(i, "".join(cell["source"])) for i, cell in enumerate(nb["cells"])]


def sections(key: str) -> set[int]:
    return {int(n) for _, text in sources(key) for n in SECTION_HEADING.findall(text)}


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_cited_sections_exist(lab):
    missing = []
    for i, text in sources(lab.number):
        for other, number in SECTION_CITED.findall(text):
            key = other or lab.number
            if int(number) not in sections(key):
                missing.append(f"cell {i}: section {number} of lab {key}")
    assert not missing, missing


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_exercises_come_in_order(lab):
    found = [n for _, text in sources(lab.number) for n in EXERCISE_HEADING.findall(text)]
    order = [int(n) if n.isdigit() else ord(n) for n in found]
    assert order == sorted(order), f"exercise headings in the order {found}"


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_cited_files_exist(lab):
    missing = [
        f"cell {i}: {path}"
        for i, text in sources(lab.number)
        for path in FILE_CITED.findall(text)
        if not (paths.ROOT / path.rstrip(".")).exists()
    ]
    private = [f"cell {i}" for i, text in sources(lab.number) if SHARED_NOTES.search(text)]
    assert not missing, missing
    assert not private, f"notes outside the repository cited in {private}"


MODULE_CITED = re.compile(r"\bptcourse(?:\.[A-Za-z_]\w*)+")


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module of the package, or something in one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            if not hasattr(found, name):
                return False
            found = getattr(found, name)
        return True
    return False


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_cited_package_names_exist(lab):
    """`ptcourse.x.y` in a notebook's text or code names a real module or attribute."""
    missing = [
        f"cell {i}: {name}"
        for i, text in sources(lab.number)
        for name in MODULE_CITED.findall(text)
        if not resolves(name)
    ]
    assert not missing, missing


IMPORTED = re.compile(r"^from (ptcourse[\w.]*) import (\w+)(?: as (\w+))?", re.MULTILINE)
IN_BACKTICKS = re.compile(r"`([^`]+)`")


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_names_the_text_gives_through_the_notebooks_imports_exist(lab):
    """`lab.MedianNorm` in the text, where the notebook imported ptcourse.labs.lab07_export as
    lab, is a real attribute: a student types what the text says."""
    cells = sources(lab.number)
    aliases = {
        alias or name: f"{module}.{name}"
        for _, text in cells
        for module, name, alias in IMPORTED.findall(text)
    }
    nb = json.loads(paths.notebook(lab).read_text())
    missing = []
    for i, text in cells:
        if nb["cells"][i]["cell_type"] != "markdown":
            continue
        for quoted in IN_BACKTICKS.findall(text):
            for alias, attribute in re.findall(r"(?<![\w.])([A-Za-z_]\w*)\.([A-Za-z_]\w*)", quoted):
                if alias in aliases and not resolves(f"{aliases[alias]}.{attribute}"):
                    missing.append(f"cell {i}: {alias}.{attribute}")
    assert not missing, missing


# "(Amdahl's law, Lab 00)", "(`Image.draft`, Lab 01–02)" and "Lab 00 (interleaved timing)":
# a term the text credits to another lab.
TERM_THEN_LAB = re.compile(r"\(([^()]{1,80}?),\s*Labs? (\d\d)(?:\s*[–-]\s*(\d\d))?\)")
LAB_THEN_TERMS = re.compile(r"\bLab (\d\d) \(([^()]{1,80})\)")


def term_of(phrase: str) -> str:
    """The word a lab must contain to teach ``phrase``: its first quoted name, else its first
    word of four letters or more (without a possessive)."""
    quoted = IN_BACKTICKS.findall(phrase)
    if quoted:
        return quoted[0]
    words = [w.removesuffix("'s") for w in re.findall(r"[A-Za-z][\w'-]*", phrase)]
    return next((w for w in words if len(w) >= 4), phrase.strip())


def credited_terms(text: str) -> list[tuple[str, list[str]]]:
    """(term, labs credited with it) for each credit in ``text``."""
    found = []
    for phrase, first, last in TERM_THEN_LAB.findall(text):
        labs = [f"{n:02d}" for n in range(int(first), int(last or first) + 1)]
        found.append((term_of(phrase), labs))
    for key, phrases in LAB_THEN_TERMS.findall(text):
        found += [(term_of(phrase), [key]) for phrase in re.split(r"[,;]", phrases)]
    return found


def text_of(key: str) -> str:
    return "\n".join(text for _, text in sources(key)).lower()


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_a_term_credited_to_another_lab_is_taught_there(lab):
    missing = [
        f"cell {i}: {term!r} is not in Lab {' or '.join(keys)}"
        for i, text in sources(lab.number)
        for term, keys in credited_terms(text)
        if not any(term.lower() in text_of(key) for key in keys if key != lab.number)
        and lab.number not in keys
    ]
    assert not missing, missing


def test_credited_terms_are_read_from_both_forms():
    text = "(Amdahl's law, Lab 00) and (`Image.draft`, Lab 01–02); Lab 00 (interleaved timing)"
    assert credited_terms(text) == [
        ("Amdahl", ["00"]), ("Image.draft", ["01", "02"]), ("interleaved", ["00"])
    ]  # fmt: skip
