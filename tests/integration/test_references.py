"""No dead ends: every "section N" a notebook cites is a numbered section of its lab (or of the
lab it names, "lab 04, section 2"), exercise headings are numbered in the order they come, and
every repository file a notebook cites exists."""

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
