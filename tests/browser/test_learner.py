"""A learner in a real browser: Lab 01 opened from the file browser, run at smoke size, its
widget pressed, an exercise written and its quick test run, the notebook validated, saved and
checked with the Check button of its last cell."""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ptcourse.course.paths import ROOT
from ptcourse.labs import lab01_data_loading as data_loading

pytestmark = pytest.mark.browser

LAB = "01-data-loading"


def _index(grade_id: str | None = None, text: str | None = None) -> int:
    """The index of a cell of the student's Lab 01: by nbgrader grade id, or by what it holds."""
    cells = json.loads((ROOT / "labs" / LAB / f"{LAB}.ipynb").read_text())["cells"]
    for index, cell in enumerate(cells):
        if grade_id and cell["metadata"].get("nbgrader", {}).get("grade_id") == grade_id:
            return index
        if text and cell["cell_type"] == "code" and text in "".join(cell["source"]):
            return index
    raise LookupError(grade_id or text)


WIDGET_CELL = _index(text="ipywidgets")  # the "Explore" cell: knobs and a Measure button
EXERCISE_CELL, TEST_CELL = _index("build_cache"), _index("test_cache")  # Exercise A, its test
CHECK_CELL = _index(text="check_button(")  # the last cell: one click grades the saved notebook
PANEL = "window.jupyterapp.shell.currentWidget"

# What a learner writes into Exercise A, pasted over the stub: the instructors' answer
BUILD_CACHE = re.sub(
    r"def reference_build_cache\(.*:\n",
    "def build_cache(files):\n",
    inspect.getsource(data_loading.reference_build_cache),
)


def wait_for(page, script: str, seconds: float) -> None:
    """Poll a JS expression in the page until it is truthy, at most ``seconds``."""
    page.wait_for_function(script, timeout=seconds * 1000, polling=500)


def show_cell(page, index: int):
    """Cell ``index`` scrolled into view (JupyterLab renders only the cells near the view)."""
    page.evaluate(f"() => {PANEL}.content.scrollToItem({index})")
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.scroll_into_view_if_needed()
    return cell


def run_cell(page, index: int) -> None:
    """Select cell ``index``, run it as Shift+Enter does, wait until the kernel is idle again."""
    page.evaluate(
        f"""() => {{ {PANEL}.content.activeCellIndex = {index};
        return window.jupyterapp.commands.execute('notebook:run-cell'); }}"""
    )
    done = f"""(() => {{ const w = {PANEL}; const c = w.content.widgets[{index}];
        return w.sessionContext.session.kernel.status === 'idle' &&
          c.model.executionCount !== null && c.promptNode.textContent.indexOf('*') < 0; }})()"""
    wait_for(page, done, 120)


def cell_output(page, index: int) -> str:
    """What cell ``index`` printed or raised, read from the notebook's model."""
    return page.evaluate(
        f"() => JSON.stringify({PANEL}.content.model.sharedModel.cells[{index}].toJSON().outputs)"
    )


def test_learner_runs_lab01_presses_widget_validates_and_checks(
    jupyter_lab: str, browser_page, shots: Path, tmp_path: Path
) -> None:
    page = browser_page
    started = time.monotonic()
    page.goto(jupyter_lab)
    # the file browser, as a learner uses it: the lab's folder, then its notebook
    page.locator(".jp-DirListing-item", has_text=LAB).first.dblclick()
    page.locator(".jp-DirListing-item", has_text=f"{LAB}.ipynb").first.dblclick()
    page.wait_for_selector(".jp-Notebook .jp-Cell")
    wait_for(page, f"{PANEL}?.sessionContext?.session?.kernel?.status === 'idle'", 120)
    page.screenshot(path=str(shots / "01-opened.png"))

    # run everything a learner runs before the widget (smoke size: PTCOURSE_SMOKE=1)
    page.evaluate(
        f"""() => {{ {PANEL}.content.activeCellIndex = {WIDGET_CELL + 1};
        return window.jupyterapp.commands.execute('notebook:run-all-above'); }}"""
    )
    done = f"""(() => {{ const w = {PANEL};
        const cells = w.content.widgets.slice(0, {WIDGET_CELL + 1});
        return w.sessionContext.session.kernel.status === 'idle' &&
          cells.every(c => c.model.type !== 'code' || c.model.executionCount !== null); }})()"""
    wait_for(page, done, 240)
    # what the cells printed and drew, read from the notebook's model (JupyterLab renders only
    # the cells in view, so the page's text holds a few cells at a time)
    outputs = page.evaluate(
        f"""() => {PANEL}.content.model.sharedModel.cells.map(
        c => JSON.stringify(c.toJSON().outputs || []))"""
    )
    ran = "\n".join(outputs[: WIDGET_CELL + 1])
    assert '"output_type":"error"' not in ran.replace(" ", ""), ran[-2000:]
    assert "track" in ran.lower(), "no track banner printed"
    assert "image/png" in ran, "no plot drawn"
    # a plot as the learner sees it: scrolled into view, rendered as an image
    plot = next(i for i, o in enumerate(outputs) if "image/png" in o)
    page.evaluate(f"() => {PANEL}.content.scrollToItem({plot})")
    page.locator(".jp-Cell").nth(plot).locator(".jp-RenderedImage img").first.wait_for()
    page.screenshot(path=str(shots / "01-plot.png"))

    # the widget responds: press Measure, a measurement appears
    page.evaluate(f"() => {PANEL}.content.scrollToItem({WIDGET_CELL})")
    widget = page.locator(".jp-Cell").nth(WIDGET_CELL)
    widget.scroll_into_view_if_needed()
    before = widget.inner_text()
    widget.locator("button", has_text="Measure").first.click()
    wait_for(page, f"{PANEL}.sessionContext.session.kernel.status === 'idle'", 120)
    page.wait_for_timeout(1000)
    assert widget.inner_text() != before
    widget.screenshot(path=str(shots / "01-widget.png"))
    page.screenshot(path=str(shots / "01-after-run.png"))

    # an exercise, as a learner does it: the visible test fails on the untouched cell, the
    # learner writes the function into the cell (pasted: insert_text), runs it, runs the test
    run_cell(page, EXERCISE_CELL)
    run_cell(page, TEST_CELL)
    assert "NotImplementedError" in cell_output(page, TEST_CELL)
    editor = show_cell(page, EXERCISE_CELL).locator(".cm-content").first
    editor.click()
    page.keyboard.press("Control+a")
    page.keyboard.insert_text(BUILD_CACHE)
    page.screenshot(path=str(shots / "01-exercise-edited.png"))
    run_cell(page, EXERCISE_CELL)
    run_cell(page, TEST_CELL)
    passed = cell_output(page, TEST_CELL)
    assert "look right" in passed and "Error" not in passed, passed
    show_cell(page, TEST_CELL)
    page.screenshot(path=str(shots / "01-visible-test-passed.png"))

    # nbgrader's Validate button in the notebook toolbar
    page.locator(".jp-Toolbar button, .jp-Toolbar jp-button", has_text="Validate").first.click()
    dialog = page.locator(".jp-Dialog")
    dialog.wait_for(timeout=180_000)
    page.wait_for_timeout(1000)
    page.screenshot(path=str(shots / "01-validate.png"))
    said = dialog.inner_text()
    assert "The following cell failed" in said, said  # the exercises left undone
    assert "build_cache(few)" not in said, said  # the one just written passes
    page.keyboard.press("Escape")

    # the learner's score: save, then the last cell's Check button grades the saved copy
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_timeout(1000)
    run_cell(page, CHECK_CELL)
    check = show_cell(page, CHECK_CELL)
    check.locator("button", has_text="Check Lab 01").first.click()
    wait_for(page, f"{PANEL}.sessionContext.session.kernel.status === 'busy'", 30)
    wait_for(page, f"{PANEL}.sessionContext.session.kernel.status === 'idle'", 600)
    report = show_cell(page, CHECK_CELL).inner_text()
    check.screenshot(path=str(shots / "01-checked.png"))
    assert "autograded points" in report and "feedback:" in report, report[-2000:]
    cache_line = next(line for line in report.splitlines() if "test_cache" in line)
    assert "1/1" in cache_line, report[-2000:]  # the exercise written above earns its point
    # checked, the lab's model answers open (the jupyter_lab fixture's build folder)
    env = {**os.environ, "PTCOURSE_BUILD": str(tmp_path / "build")}
    answers = subprocess.run(
        [sys.executable, "-m", "ptcourse.course.cli", "answers", "01"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert answers.returncode == 0 and "Rubric" in answers.stdout, answers.stderr[-1000:]
    print(f"browser tier: {time.monotonic() - started:.0f} s")


def test_report_card_renders_for_a_reader(browser_page, shots: Path, tmp_path: Path) -> None:
    """The report card of a real run (Lab 00 at smoke size), as a reader's browser shows it: the
    machine and its measured ceilings on top, each check's measurement placed between zero
    credit and its target (lower-is-better errors included) with the claim the lab tests."""
    env = {**os.environ, "PTCOURSE_BUILD": str(tmp_path / "build")}
    command = [sys.executable, "-m", "ptcourse.course.cli", "run", "--smoke", "00"]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    page = browser_page
    page.goto((tmp_path / "build" / "report" / "report.html").as_uri())
    text = page.inner_text("body")
    assert "CPU:" in text and "Ceilings measured for this report" in text, text[:500]
    assert "time_it_compute" in text and "share of that bound" in text, text[:2000]
    drawn = page.evaluate("() => [...document.images].map(i => i.complete && i.naturalWidth)")
    assert drawn and all(width > 300 for width in drawn), drawn
    page.screenshot(path=str(shots / "report-card.png"), full_page=True)
