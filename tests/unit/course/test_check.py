"""A learner's own check (ptcourse.course.selfcheck): which notebooks are touched, a notebook's
lab, bad input in one line, what a check prints and records, the progress table, and the model
answers refused before a check and given after. The grading itself (``ptcourse grade`` in a
child process) is stubbed here: tests/integration/test_selfcheck.py runs one for real."""

import datetime
import json
import os
import subprocess

import pytest

from ptcourse.core.errors import CourseInputError
from ptcourse.core.lineup import UnknownLab, lab
from ptcourse.course import cli, paths, selfcheck

ACCUMULATION = lab("04")
LINES = {  # what the judge leaves in a graded cell's outputs, per cell of Lab 04
    "test_accumulation_visible": [
        {"output_type": "stream", "name": "stdout", "text": "gradients and loss match\n"},
        {
            "output_type": "stream",
            "name": "stdout",
            "text": "the judge's check of the same answer (gradients) gave full credit\n",
        },
    ],
    "test_memory_hidden": [
        {
            "output_type": "stream",
            "name": "stdout",
            "text": [
                "[lab 04 · peak_memory] memory_ratio 3.63; target ≥ 3, zero credit at 1.3; "
                "track cpu on cpu: 3/3 points\n",
                "  baseline peak +21.1 MB over 346 MB\n",
            ],
        },
        {"output_type": "execute_result", "data": {"text/plain": "3.0"}, "metadata": {}},
    ],
}
POINTS = {
    "test_accumulation_visible": 2.0,
    "test_amp_visible": 0.0,
    "test_gradients_hidden": 3.0,
    "test_amp_hidden": 0.0,
    "test_memory_hidden": 3.0,
}


@pytest.fixture(autouse=True)
def build(tmp_path, monkeypatch):
    """A build folder of the test's own; smoke mode as the test leaves it is undone after."""
    folder = tmp_path / "build"
    monkeypatch.setattr(paths, "BUILD", folder)
    monkeypatch.setenv("PTCOURSE_SMOKE", "1")
    return folder


def released(the_lab=ACCUMULATION):
    return json.loads(paths.notebook(the_lab, "labs").read_text())


def write(path, nb):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(nb if isinstance(nb, str) else json.dumps(nb))
    return path


def cell(nb, grade_id):
    return next(
        c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id
    )


# Touched


def test_a_released_notebook_is_untouched_and_running_it_does_not_touch_it(tmp_path):
    nb = released()
    assert not selfcheck.touched(write(tmp_path / "a.ipynb", nb))
    cell(nb, "accumulated_step")["outputs"] = [
        {"output_type": "stream", "name": "stdout", "text": "ran\n"}
    ]
    cell(nb, "accumulated_step")["execution_count"] = 3
    nb["cells"][0]["source"] = "# my notes on the lab\n"  # not an answer cell
    assert not selfcheck.touched(write(tmp_path / "b.ipynb", nb))


@pytest.mark.parametrize("answer", ["accumulated_step", "reflection"])
def test_an_edited_answer_code_or_written_touches_it(answer, tmp_path):
    nb = released()
    cell(nb, answer)["source"] = "my answer"
    assert selfcheck.touched(write(tmp_path / "a.ipynb", nb))


def test_a_missing_notebook_is_untouched_and_an_unreadable_one_touched(tmp_path):
    assert not selfcheck.touched(tmp_path / "gone.ipynb")
    assert selfcheck.touched(write(tmp_path / "broken.ipynb", "{not json"))


def test_touched_labs_are_those_whose_answers_changed(tmp_path):
    labs = tmp_path / "labs"
    for each in (lab("04"), lab("06")):
        write(labs / each.name / f"{each.name}.ipynb", released(each))
    assert selfcheck.touched_labs(labs) == []
    nb = released()
    cell(nb, "accumulated_step")["source"] = "def accumulated_step(*args):\n    return 0.0\n"
    write(labs / ACCUMULATION.name / f"{ACCUMULATION.name}.ipynb", nb)
    assert selfcheck.touched_labs(labs) == [ACCUMULATION]


def test_no_arguments_check_every_touched_lab_or_say_there_is_none(monkeypatch):
    monkeypatch.setattr(selfcheck, "touched_labs", lambda: [])
    with pytest.raises(CourseInputError, match="nothing to check: no notebook in labs/"):
        selfcheck.targets()
    monkeypatch.setattr(selfcheck, "touched_labs", lambda: [ACCUMULATION])
    assert selfcheck.targets() == [
        selfcheck.Target(ACCUMULATION, paths.notebook(ACCUMULATION, "labs"))
    ]


# A notebook's lab, and bad input


@pytest.mark.parametrize("key", ["04", "4", "04-grad-accumulation", "grad-accumulation"])
def test_a_lab_key_names_its_notebook_in_labs(key):
    assert selfcheck.target(key) == selfcheck.Target(
        ACCUMULATION, paths.notebook(ACCUMULATION, "labs")
    )


def test_a_notebook_path_is_the_lab_its_cells_name(tmp_path):
    mine = write(tmp_path / "my attempt.ipynb", released(lab("06")))
    assert selfcheck.target(str(mine)) == selfcheck.Target(lab("06"), mine)
    solution = paths.notebook(ACCUMULATION)
    assert selfcheck.target(str(solution)).lab == ACCUMULATION


def test_an_unknown_lab_is_the_unknown_lab_line():
    with pytest.raises(UnknownLab, match="no lab '99': name one by number"):
        selfcheck.target("99")


@pytest.mark.parametrize(
    "content,said",
    [
        (None, "no such notebook: "),
        ("", "is not a notebook: the file is empty — start from a fresh copy"),
        ("{not json", "is not a notebook: invalid JSON: "),
        ({"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}, "no nbgrader cell ids"),
        ("OTHER", "has none of any lab's cells (a notebook from elsewhere?)"),
    ],
    ids=["missing", "empty", "not-json", "no-ids", "other-ids"],
)
def test_a_bad_notebook_path_is_one_line(content, said, tmp_path):
    path = tmp_path / "mine.ipynb"
    if content == "OTHER":
        nb = released()
        for each in nb["cells"]:
            if "nbgrader" in each["metadata"]:
                each["metadata"]["nbgrader"]["grade_id"] += "_elsewhere"
        content = nb
    if content is not None:
        write(path, content)
    with pytest.raises(CourseInputError) as raised:
        selfcheck.target(str(path))
    assert said in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    "argv,said",
    [
        (["check", "99"], "ptcourse: error: no lab '99': name one by number (06)"),
        (["check", "04", "nope.ipynb"], "ptcourse: error: no such notebook: nope.ipynb"),
        (["answers", "99"], "ptcourse: error: no lab '99': name one by number (06)"),
    ],
)
def test_bad_input_is_one_line_before_any_grading(argv, said, monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "grade", lambda *a: pytest.fail("graded"))
    assert cli.main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(said) and err.count("\n") == 1, err


# A check, with the grading stubbed


def fake_grade(points=None, status="graded", detail=""):
    """``ptcourse grade`` as the child process leaves its build folder: grades.json, the judged
    notebook, the feedback HTML."""
    calls = []

    def grade(submissions, the_lab, folder, timeout_s):
        name = f"{the_lab.name}.ipynb"
        handed_in = submissions / selfcheck.STUDENT / the_lab.name / name
        calls.append((handed_in.read_text(), folder, timeout_s))
        nb = json.loads(handed_in.read_text())
        for grade_id, outputs in LINES.items():
            cell(nb, grade_id)["outputs"] = outputs
        write(folder / "judge" / "submitted" / selfcheck.STUDENT / the_lab.name / name, nb)
        html = folder / "nbgrader" / "feedback" / selfcheck.STUDENT / the_lab.name
        write(html / f"{the_lab.name}.html", "<html></html>")
        score = {"status": status, "cells": points or POINTS, "written_max": 5.0}
        write(folder / "grades" / "grades.json", [{**score, "detail": detail}])
        return subprocess.CompletedProcess([], 0, "", "")

    grade.calls = calls
    return grade


def test_a_check_grades_a_copy_in_the_private_build_folder(monkeypatch, build):
    grade = fake_grade()
    monkeypatch.setattr(selfcheck, "grade", grade)
    goal = selfcheck.target("04")
    checked = selfcheck.check(goal, 120)
    ((text, folder, timeout_s),) = grade.calls
    assert text == goal.notebook.read_text() and folder == build / "check" and timeout_s == 120
    assert checked.status == "graded" and (checked.points, checked.max_points) == (8, 10)
    assert [c.cell for c in checked.cells] == list(POINTS)  # the notebook's order
    assert checked.feedback == folder / "nbgrader" / "feedback" / "me" / goal.lab.name / (
        f"{goal.lab.name}.html"
    )
    shown = selfcheck.report(checked).splitlines()
    assert shown[0].split() == [
        "test_accumulation_visible",
        "2/2",
        *"the judge's check of the same answer (gradients) gave full credit".split(),
    ]
    memory = next(line for line in shown if "test_memory_hidden" in line)
    assert "3/3  [lab 04 · peak_memory] memory_ratio 3.63; target ≥ 3" in memory
    assert "test_amp_visible" in shown[1] and "0/1  (no message)" in shown[1]
    assert shown[-2].startswith("Lab 04 (04-grad-accumulation): 8/10 autograded points; 5 more")
    assert shown[-1] == f"feedback: {checked.feedback}"


def test_the_instructors_gradebook_is_never_the_checks(monkeypatch, build):
    ran = []
    monkeypatch.setattr(subprocess, "run", lambda command, **kw: ran.append((command, kw)))
    selfcheck.grade(build / "check" / "submissions", ACCUMULATION, build / "check", 60)
    ((command, kw),) = ran
    assert command[1:] == [
        "-m",
        "ptcourse.course.cli",
        "grade",
        str(build / "check" / "submissions"),
        "04",
        "--timeout",
        "60",
    ]
    assert kw["env"]["PTCOURSE_BUILD"] == str((build / "check").resolve())


def test_a_grading_that_fails_is_one_line_and_records_nothing(monkeypatch, build):
    def broken(*args):
        return subprocess.CompletedProcess(
            [], 1, "", "Traceback (most recent call last):\n  …\nRuntimeError: boom\n"
        )

    monkeypatch.setattr(selfcheck, "grade", broken)
    checked = selfcheck.check(selfcheck.target("04"))
    assert checked.status == "failed" and checked.detail == "grading failed: RuntimeError: boom"
    assert selfcheck.report(checked) == (
        "Lab 04 (04-grad-accumulation): not graded (failed): grading failed: RuntimeError: boom"
    )
    assert selfcheck.record(checked) == 0 and not selfcheck.progress_file().exists()


def test_a_refused_notebook_says_why(monkeypatch):
    why = "the notebook has no nbgrader cell ids (made outside the lab's copy …) — start from …"
    monkeypatch.setattr(selfcheck, "grade", fake_grade(status="failed", detail=why))
    checked = selfcheck.check(selfcheck.target("04"))
    assert selfcheck.report(checked) == f"Lab 04 (04-grad-accumulation): not graded (failed): {why}"


def test_ptcourse_check_prints_records_and_opens_the_answers(monkeypatch, capsys):
    monkeypatch.setattr(selfcheck, "grade", fake_grade())
    assert cli.main(["answers", "04"]) == 2
    assert capsys.readouterr().err == (
        "ptcourse: error: Lab 04's model answers open after you have checked it: run "
        "`ptcourse check 04` first\n"
    )
    assert cli.main(["check", "04"]) == 0
    out = capsys.readouterr().out
    assert (
        out.startswith("checking Lab 04 (") and "04-grad-accumulation.ipynb) at smoke size" in out
    )
    assert "8/10 autograded points" in out and "feedback: " in out
    rows = [json.loads(line) for line in selfcheck.progress_file().read_text().splitlines()]
    assert [(r["lab"], r["cell"], r["points"], r["max"]) for r in rows] == [
        ("04-grad-accumulation", name, points, maximum)
        for (name, points), maximum in zip(POINTS.items(), [2, 1, 3, 1, 3], strict=True)
    ]
    assert len({r["time"] for r in rows}) == 1 and all(r["smoke"] for r in rows)
    assert cli.main(["answers", "04"]) == 0
    answers = capsys.readouterr().out
    first = answers.splitlines()[0]
    assert first.startswith("The instructors' model answers for Lab 04 (04-grad-accumulation)")
    for needle in ("── accumulated_step · exercise", "def accumulated_step(", "tensor_split"):
        assert needle in answers
    for needle in (
        "── explain_batchnorm · written question, 1 point ──",
        "**Question (1 point).**",
    ):
        assert needle in answers
    assert "Model answer (instructors)" in answers and "Rubric (2 points)" in answers
    assert "### BEGIN SOLUTION" not in answers and "YOUR ANSWER HERE" not in answers


def test_smoke_flag_reaches_the_grading(monkeypatch, capsys):
    seen = []
    monkeypatch.setenv("PTCOURSE_SMOKE", "0")
    grade = fake_grade()
    monkeypatch.setattr(
        selfcheck, "grade", lambda *args: seen.append(os.environ["PTCOURSE_SMOKE"]) or grade(*args)
    )
    assert cli.main(["check", "--smoke", "04"]) == 0
    assert seen == ["1"] and "smoke size" in capsys.readouterr().out


# What the judge's outputs say


def test_verdict_lines_are_the_checks_lines_or_the_last_line_and_the_error():
    stream = {"output_type": "stream", "name": "stdout"}
    assert selfcheck.verdict_lines(LINES["test_memory_hidden"]) == [
        "[lab 04 · peak_memory] memory_ratio 3.63; target ≥ 3, zero credit at 1.3; "
        "track cpu on cpu: 3/3 points"
    ]
    assert selfcheck.verdict_lines(
        [
            {**stream, "text": "UNSANDBOXED (no bubblewrap here: …): bwrap missing\n"},
            {**stream, "text": "first\nall 4 cases equal\n"},
            {**stream, "text": []},
        ]
    ) == ["UNSANDBOXED (no bubblewrap here: …): bwrap missing", "all 4 cases equal"]
    error = {"output_type": "error", "ename": "CheckFailed", "evalue": "NotImplementedError: "}
    assert selfcheck.verdict_lines([{**stream, "text": []}, error]) == [
        "CheckFailed: NotImplementedError"
    ]


def test_the_judges_notes_are_known_by_how_they_begin():
    from ptcourse.judge.judge import PER_PROCESS, UNSANDBOXED

    assert UNSANDBOXED.startswith(selfcheck.JUDGE_NOTES[0])
    assert PER_PROCESS.startswith(selfcheck.JUDGE_NOTES[1])


# Progress


def test_progress_is_best_and_last_per_lab_and_a_dash_where_never_checked(capsys):
    def check_of(points):
        cells = [selfcheck.CellResult("a", points, 6), selfcheck.CellResult("b", 1, 4)]
        return selfcheck.Checked(ACCUMULATION, paths.notebook(ACCUMULATION), "graded", cells)

    assert cli.main(["progress"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["lab", "best", "last", "max", "checks"]
    assert table[1 + 4].split() == ["04-grad-accumulation", "—", "—", "10", "0"]
    assert table[-2].split()[:3] == ["total", "—", "—"]
    start = datetime.datetime(2026, 12, 7, 9, 0, tzinfo=datetime.timezone.utc)
    for minute, points in enumerate((3, 5, 2)):
        when = start + datetime.timedelta(minutes=minute)
        assert selfcheck.record(check_of(points), when) == 2
    with selfcheck.progress_file().open("a") as f:
        f.write('{"torn line\n')
    assert selfcheck.checks() == {"04-grad-accumulation": [4, 6, 3]}
    table = selfcheck.progress_table().splitlines()
    assert table[1 + 4].split() == ["04-grad-accumulation", "6", "3", "10", "3"]
    assert table[1 + 6].split() == ["06-attention", "—", "—", "19", "0"]
    maximum = sum(selfcheck.autograded_max(each) for each in paths.course_labs())
    assert table[-1].split() == ["total", "6", "3", f"{maximum:g}"]


def test_the_maximum_is_the_labs_autograded_points():
    assert selfcheck.autograded_max(ACCUMULATION) == 10


def test_solution_code_drops_nbgraders_markers():
    source = "def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION\n"
    assert selfcheck.solution_code(source) == "def f():\n    return 1"
