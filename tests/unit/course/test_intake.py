"""What `ptcourse grade` takes in (ptcourse.course.intake): each bad submission is one line that
says what is wrong and what to do, never a traceback, and nothing of it runs; a bad folder is a
CourseInputError; a missing notebook says where it seems to be."""

import json

import pytest

from ptcourse.core.errors import CourseInputError
from ptcourse.core.lineup import LABS, lab
from ptcourse.course import intake, paths

ATTENTION = lab("06")
FRESH = "start from a fresh copy of labs/06-attention/06-attention.ipynb"


def released(key="06"):
    return json.loads(paths.notebook(lab(key), "labs").read_text())


def handed_in(tmp_path, content, student="alice", folder="06-attention", name=None):
    """``content`` (bytes, text or a notebook) handed in as ``student/folder/name``."""
    target = tmp_path / student / folder / (name or f"{folder}.ipynb")
    target.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        target.write_bytes(content)
    else:
        target.write_text(content if isinstance(content, str) else json.dumps(content))
    return target


def one_line(text):
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


@pytest.mark.parametrize("folder", ["labs", "solutions"])
def test_every_labs_own_notebook_is_taken(folder, tmp_path):
    for each in LABS:
        nb = json.loads(paths.notebook(each, folder).read_text())
        assert intake.refusal(each, handed_in(tmp_path, nb, folder=each.name)) is None, each.name


def test_a_notebook_edited_as_learners_and_attacks_do_is_taken(tmp_path):
    nb = released()
    # a cell added without an id (nbformat 4.5 wants one) and without metadata, a note first
    nb["cells"].insert(4, {"cell_type": "code", "metadata": {}, "outputs": [],
                           "execution_count": None, "source": "x = 1"})  # fmt: skip
    nb["cells"].insert(0, {"cell_type": "markdown", "metadata": {}, "source": "My notes."})
    # a cell of an older release whose id has since been renamed
    solution = next(c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("solution"))
    solution["metadata"]["nbgrader"]["grade_id"] = "renamed_since"
    assert intake.refusal(ATTENTION, handed_in(tmp_path, nb)) is None


def test_a_missing_notebook_is_not_refused_but_missing(tmp_path):
    assert intake.refusal(ATTENTION, tmp_path / "alice" / "06-attention" / "x.ipynb") is None


@pytest.mark.parametrize(
    "content,reason",
    [
        ("this is not json\n", "invalid JSON: Expecting value: line 1 column 1 —"),
        (
            json.dumps(released())[:3000],
            "invalid JSON: Unterminated string starting at: line 1 column",
        ),
        ("", "the file is empty"),
        (b"\x89PNG\r\n\x1a\n\x00\x00", "not UTF-8 text (byte 0x89 at offset 0"),
        ("{}", "JSON without a notebook's cells"),
        ("[1, 2]", "a JSON list, where a notebook is an object with cells"),
        ('"notebook"', "a JSON string, where a notebook is an object with cells"),
        ('{"cells": {}, "metadata": {}}', "its cells are a JSON object, not a list"),
        ('{"cells": [1], "metadata": {}, "nbformat": 4}', "cell 1 is a JSON number, not a cell"),
        ('{"cells": [], "metadata": {}, "nbformat": 9}', "nbformat cannot read it: Unsupported"),
    ],
    ids=["text", "truncated", "empty", "binary", "{}", "list", "string", "cells", "cell", "v9"],
)
def test_a_file_that_is_not_a_notebook_is_refused_in_one_line(tmp_path, content, reason):
    refused = one_line(intake.refusal(ATTENTION, handed_in(tmp_path, content)))
    assert refused.startswith(f"not a notebook: {reason}"), refused
    assert refused.endswith(f"{FRESH}, paste your code into its cells and hand that in")


def test_another_labs_notebook_is_named(tmp_path):
    refused = one_line(intake.refusal(ATTENTION, handed_in(tmp_path, released("03"))))
    assert refused == (
        "this is Lab 03's notebook (03-mixed-precision), handed in as Lab 06 (06-attention) — "
        "hand in Lab 06's notebook as 06-attention/06-attention.ipynb and this one as "
        "03-mixed-precision/03-mixed-precision.ipynb"
    )


def test_a_notebook_without_nbgrader_ids_is_refused(tmp_path):
    nb = released()
    for cell in nb["cells"]:
        cell["metadata"].pop("nbgrader", None)
    refused = one_line(intake.refusal(ATTENTION, handed_in(tmp_path, nb)))
    assert refused.startswith("the notebook has no nbgrader cell ids") and FRESH in refused


def test_a_notebook_with_only_shared_or_foreign_ids_is_refused(tmp_path):
    nb = released()
    for number, cell in enumerate(nb["cells"]):
        meta = cell["metadata"].get("nbgrader")
        if meta and meta["grade_id"] not in ("setup", "parameters", "sizes"):
            meta["grade_id"] = f"elsewhere_{number}"
    refused = one_line(intake.refusal(ATTENTION, handed_in(tmp_path, nb)))
    assert refused.startswith("the notebook has none of Lab 06's cells") and FRESH in refused


def test_every_lab_is_known_by_its_own_cells():
    for each in LABS:
        assert intake.lab_of(intake.grade_ids(released(each.number))) == each
    assert intake.lab_of(["setup", "parameters", "sizes"]) is None


@pytest.mark.parametrize(
    "place,said",
    [
        ("06/06-attention.ipynb", "Lab 06's notebook is at 06/06-attention.ipynb"),
        ("06-attention.ipynb", "Lab 06's notebook is at 06-attention.ipynb"),
        ("06-attention/Untitled.ipynb", "Lab 06's notebook is at 06-attention/Untitled.ipynb"),
        ("lab6/mine.ipynb", "Lab 06's notebook is at lab6/mine.ipynb"),  # known by its cells
    ],
)
def test_a_missing_notebook_says_where_it_seems_to_be(tmp_path, place, said):
    target = tmp_path / "alice" / place
    target.parent.mkdir(parents=True)
    target.write_text(json.dumps(released()))
    where = one_line(intake.whereabouts(ATTENTION, tmp_path / "alice"))
    assert where == f"{said} — hand it in as 06-attention/06-attention.ipynb"


def test_a_missing_notebook_in_an_empty_or_unrelated_folder(tmp_path):
    (tmp_path / "alice" / "06-attention").mkdir(parents=True)
    assert intake.whereabouts(ATTENTION, tmp_path / "alice") == (
        "06-attention/ holds no notebook — hand in 06-attention/06-attention.ipynb"
    )
    handed_in(tmp_path, released("03"), student="bob", folder="notes", name="lab3.ipynb")
    handed_in(tmp_path, "not json", student="bob", folder="junk")
    handed_in(tmp_path, released("06"), student="bob", folder=".ipynb_checkpoints")
    assert intake.whereabouts(ATTENTION, tmp_path / "bob") == ""
    assert intake.whereabouts(ATTENTION, tmp_path / "carol") == ""


def test_folders_not_named_as_labs_are_listed(tmp_path):
    handed_in(tmp_path, released(), folder="99-foo")
    handed_in(tmp_path, released(), folder="06-attention")
    handed_in(tmp_path, released("03"), student="bob", folder="03-mixed-precision")
    assert intake.strays(tmp_path, ["alice", "bob"]) == [
        "alice/99-foo/ is not a lab folder and is not graded "
        "(lab folders are named like 06-attention)"
    ]


def test_students_of_a_good_folder_skip_hidden_ones(tmp_path):
    for name in ("bob", "alice", ".ipynb_checkpoints"):
        (tmp_path / name).mkdir()
    (tmp_path / "notes.txt").write_text("")
    assert intake.students(tmp_path) == ["alice", "bob"]


@pytest.mark.parametrize(
    "make,said",
    [
        (lambda root: root / "nope", "no such folder: "),
        (lambda root: handed_in(root, "{}"), "not a folder: "),
        (lambda root: root, "no student folders in "),
        (lambda root: handed_in(root, "{}").parents[1], "holds lab folders (06-attention)"),
    ],
    ids=["missing", "file", "empty", "one-student"],
)
def test_a_bad_submissions_folder_is_one_line(tmp_path, make, said):
    with pytest.raises(CourseInputError) as error:
        intake.students(make(tmp_path))
    assert said in one_line(str(error.value))
    assert "<student>/<lab>/<lab>.ipynb" in str(error.value)


NBGRADER_LOG = """\
[INFO] Sanitizing /subs/alice/06-attention/06-attention.ipynb
[ERROR] There was an error processing assignment: /subs/alice/06-attention
[ERROR] Traceback (most recent call last):
      File ".../nbgrader/preprocessors/overwritecells.py", line 137, in add_missing_grade_cells
        prev_cell_idx = submitted_cell_idxs[prev_cell_id] + added_count
                        ~~~~~~~~~~~~~~~~~~~^^^^^^^^^^^^^^
    KeyError: 'attention_naive'
[ERROR] There was an error processing assignment '06-attention' for student 'alice'
[ERROR] Please see the the above traceback for details on the specific errors on the above failures.
    nbgrader.converters.base.NbGraderException: Please see the the above traceback for details
"""


def test_what_nbgrader_cannot_take_is_one_line_with_its_reason(tmp_path):
    nb = released()
    ids = [c["metadata"].get("nbgrader", {}).get("grade_id") for c in nb["cells"]]
    start = ids.index("attention_naive")
    del nb["cells"][start : start + 2]  # the exercise and its visible test
    said = one_line(intake.nbgrader_failure(ATTENTION, NBGRADER_LOG, handed_in(tmp_path, nb)))
    assert said == (
        "nbgrader could not take the notebook (KeyError: 'attention_naive'): it lacks Lab 06's "
        "cells attention_naive, test_naive_visible (deleted?) — "
        f"{FRESH}, paste your code into its cells and hand that in"
    )
    whole = handed_in(tmp_path, released(), student="bob")
    said = one_line(intake.nbgrader_failure(ATTENTION, "    OSError: disk full\n", whole))
    assert said == "nbgrader could not take the notebook (OSError: disk full)"
    bare = intake.nbgrader_failure(ATTENTION, "", tmp_path / "gone.ipynb")
    assert bare == "nbgrader could not take the notebook"


def test_grading_refuses_bad_submissions_unrun_and_goes_on_with_the_others(
    monkeypatch, tmp_path, capsys
):
    """autograde() with nbgrader's and the judge's steps stubbed: a refused notebook reaches
    neither, each bad submission is one line in the table and the CSV, the good one is graded."""
    import csv
    import subprocess

    from ptcourse.course import autograde

    reached = []
    monkeypatch.setattr(autograde, "BUILD", tmp_path / "build")
    monkeypatch.setattr(autograde, "release", lambda keys, release_dir: [])
    monkeypatch.setattr(autograde, "_feedback", lambda scores, release_dir: None)
    monkeypatch.setattr(autograde, "_books", lambda lab, student, *a, **k: reached.append(student))
    monkeypatch.setattr(
        autograde, "_judge", lambda *a, **k: subprocess.CompletedProcess([], 0, "", "")
    )
    monkeypatch.setattr(
        autograde,
        "_scores_from_gradebook",
        lambda the_lab, student: autograde.Score(student, the_lab.name, "graded", 3, 5),
    )
    subs = tmp_path / "subs"
    handed_in(subs, released(), student="good")
    handed_in(subs, "not json", student="broken")
    handed_in(subs, released("03"), student="other")
    handed_in(subs, released(), student="astray", folder="lab6", name="mine.ipynb")
    scores = {s.student: s for s in autograde.autograde(subs, ["06"])}
    assert set(reached) == {"good"}
    assert scores["good"].status == "graded" and scores["good"].auto_score == 3
    assert scores["broken"].status == scores["other"].status == "failed"
    assert scores["broken"].detail.startswith("not a notebook: invalid JSON")
    assert scores["other"].detail.startswith("this is Lab 03's notebook")
    assert scores["astray"].status == "missing"
    assert scores["astray"].detail.startswith("Lab 06's notebook is at lab6/mine.ipynb")
    captured = capsys.readouterr()
    assert "astray/lab6/ is not a lab folder" in captured.err
    assert "Traceback" not in captured.out + captured.err

    table = autograde.score_table(list(scores.values()))
    assert all(one_line(s.detail) in table for s in scores.values() if s.detail)
    rows = csv.DictReader(
        autograde.write_grades_csv(list(scores.values()), tmp_path / "g.csv").open()
    )
    assert {r["student"]: r["detail"] for r in rows}["other"] == scores["other"].detail
