"""The last cell of every lab: one click grades the saved notebook with ``ptcourse check`` (the
course's judge, sandbox and hidden tests, as an instructor's grading) and shows its report, per
graded cell, under the button. It runs the command line in a child process: the notebook's own
kernel never holds the course's grading code."""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ptcourse.core.lineup import Lab


def notebook_path(lab: Lab, cwd: Path | None = None) -> Path | None:
    """The notebook this kernel runs. Jupyter Server names it in ``JPY_SESSION_NAME`` (a full
    path, or one relative to the server's folder in some versions); a kernel starts in the
    notebook's folder, so a relative name is looked up there. Else the lab's notebook there."""
    cwd = cwd or Path.cwd()
    named = os.environ.get("JPY_SESSION_NAME", "")
    candidates = [Path(named), cwd / Path(named).name] if named.endswith(".ipynb") else []
    candidates.append(cwd / f"{lab.name}.ipynb")
    return next((path for path in candidates if path.is_absolute() and path.is_file()), None)


def check_command(notebook: Path) -> list[str]:
    return [sys.executable, "-m", "ptcourse.course.cli", "check", str(notebook)]


def run_check(lab: Lab, say: Callable[[str], Any] = print, cwd: Path | None = None) -> int:
    """Check the saved copy of this lab's notebook; every line ``ptcourse check`` prints goes
    to ``say``. Returns its exit status."""
    notebook = notebook_path(lab, cwd)
    if notebook is None:
        say(
            f"Could not tell which notebook this kernel runs: save it as {lab.name}.ipynb in "
            f"this folder, or run `ptcourse check PATH` in a terminal."
        )
        return 2
    saved = datetime.datetime.fromtimestamp(notebook.stat().st_mtime).strftime("%H:%M:%S")
    say(
        f"Checking {notebook} as saved at {saved} (save first to check your latest changes): "
        "the judge runs every cell and the hidden tests, a minute or more."
    )
    with subprocess.Popen(
        check_command(notebook),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as process:
        for line in process.stdout or ():
            say(line.rstrip("\n"))
    return process.returncode


def check_button(lab: Lab) -> Any:
    """A "Check" button and the area where its report appears (ipywidgets)."""
    import ipywidgets as widgets

    button = widgets.Button(
        description=f"Check Lab {lab.number}",
        icon="check",
        tooltip="Grade the saved notebook with the course's judge (ptcourse check)",
    )
    report = widgets.Output()

    def clicked(_: Any) -> None:
        button.disabled = True
        report.clear_output()
        # append_stdout, not print inside `with report`: a callback's prints are flushed after
        # it returns, outside the widget, and all but the first line were lost in JupyterLab
        run_check(lab, lambda line: report.append_stdout(line + "\n"))
        button.disabled = False

    button.on_click(clicked)
    return widgets.VBox([button, report])
