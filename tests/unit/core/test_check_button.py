"""The "Check" button at the end of every lab: which notebook it checks, and that it runs
``ptcourse check`` on it and shows every line. The grading itself is stubbed (a child process
that prints); tests/integration/test_selfcheck.py runs a real check."""

import sys

import pytest

from ptcourse.core import check_button
from ptcourse.core.lineup import lab

ACCUMULATION = lab("04")


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    notebook = tmp_path / f"{ACCUMULATION.name}.ipynb"
    notebook.write_text("{}")
    return tmp_path


def test_the_notebook_jupyter_names_is_checked(folder, monkeypatch):
    mine = folder / "my copy.ipynb"
    mine.write_text("{}")
    monkeypatch.setenv("JPY_SESSION_NAME", str(mine))
    assert check_button.notebook_path(ACCUMULATION, folder) == mine
    monkeypatch.setenv("JPY_SESSION_NAME", "labs/04/my copy.ipynb")  # relative to the server
    assert check_button.notebook_path(ACCUMULATION, folder) == mine


def test_without_a_name_the_labs_notebook_in_the_kernels_folder(folder, tmp_path):
    assert check_button.notebook_path(ACCUMULATION, folder) == folder / f"{ACCUMULATION.name}.ipynb"
    assert check_button.notebook_path(ACCUMULATION, tmp_path / "elsewhere") is None


def test_a_click_runs_ptcourse_check_on_the_saved_notebook_and_shows_every_line(
    folder, monkeypatch
):
    seen = []
    fake = [sys.executable, "-c", "import sys; print('checked', sys.argv[1]); print('12/12')"]
    monkeypatch.setattr(check_button, "check_command", lambda path: [*fake, str(path)])
    status = check_button.run_check(ACCUMULATION, seen.append, folder)
    assert status == 0
    assert seen[0].startswith(f"Checking {folder / ACCUMULATION.name}.ipynb as saved at")
    assert seen[1:] == [f"checked {folder / ACCUMULATION.name}.ipynb", "12/12"]


def test_the_command_is_ptcourse_check(folder):
    notebook = folder / f"{ACCUMULATION.name}.ipynb"
    assert check_button.check_command(notebook)[1:] == [
        "-m", "ptcourse.course.cli", "check", str(notebook)
    ]  # fmt: skip


def test_no_notebook_found_says_what_to_do(tmp_path, monkeypatch):
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    seen = []
    assert check_button.run_check(ACCUMULATION, seen.append, tmp_path) == 2
    assert "ptcourse check PATH" in seen[0]


def test_the_button_is_a_widget_with_an_area_for_the_report():
    box = check_button.check_button(ACCUMULATION)
    button, report = box.children
    assert button.description == "Check Lab 04"
    assert report.outputs == ()
