"""The judge's reading of a notebook: which cell asks for which check, who grades each cell."""

import nbformat
import pytest

from ptcourse.judge.judge import HiddenCall, Plan, hidden_call
from ptcourse.labs import all_targets, module, written


def test_a_hidden_cell_names_its_check_its_answers_and_points():
    source = (
        "# visible part\nassert True\n### BEGIN HIDDEN TESTS\n"
        "from ptcourse.labs import fresh\n\n"
        'fresh("09").check_diagnosis(DOMINANT_OP, DOMINANT_SHAPE, DOMINANT_STAGE, points=3)\n'
        "### END HIDDEN TESTS\n"
    )
    assert hidden_call(source) == HiddenCall(
        "09", "check_diagnosis", ("DOMINANT_OP", "DOMINANT_SHAPE", "DOMINANT_STAGE"), 3.0
    )
    assert hidden_call("fresh('06').check_speed(x, points=3)") is None  # not in a hidden block


@pytest.mark.parametrize("lab_module", written(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_judged_and_vouched_checks_exist(lab_module):
    checks = {name.removeprefix("check_") for name in dir(lab_module) if name.startswith("check_")}
    judged = set(getattr(lab_module, "JUDGED", ()))
    assert judged <= checks
    assert set(getattr(lab_module, "VOUCHED", {}).values()) <= judged


@pytest.mark.parametrize("lab_module", written(), ids=lambda m: m.__name__.rsplit(".", 1)[-1])
def test_every_autograded_cell_is_judged_or_vouched_for(lab_module):
    from ptcourse.course import paths

    nb = nbformat.read(paths.notebook(lab_module.LAB), as_version=4)
    judged, vouched = set(lab_module.JUDGED), getattr(lab_module, "VOUCHED", {})
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        call = hidden_call(cell.source)
        if call is not None:
            assert call.check.removeprefix("check_") in judged, meta["grade_id"]
        else:
            assert meta["grade_id"] in vouched, f"{meta['grade_id']} carries points unjudged"


def _cell(grade_id, source, solution=False, grade=True):
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["nbgrader"] = {"grade_id": grade_id, "grade": grade, "solution": solution}
    return cell


class FakeJudge:
    def __init__(self, verdict_error: bool, cell_outputs):
        self.checked, self.verdict_error, self.cell_outputs = [], verdict_error, cell_outputs

    def judge_cell(self, call):
        self.checked.append(call.check)
        if self.verdict_error:
            return [nbformat.v4.new_output("error", ename="CheckFailed", evalue="no", traceback=[])]
        return [nbformat.v4.new_output("execute_result", data={"text/plain": "2.0"})]

    def run_cell(self, index, source):
        return [nbformat.from_dict(o) for o in self.cell_outputs]


def _plan():
    hidden = (
        "### BEGIN HIDDEN TESTS\nfrom ptcourse.labs import fresh\n"
        'fresh("06").check_naive(attention_naive, points=2)\n### END HIDDEN TESTS'
    )
    nb = nbformat.v4.new_notebook()
    nb.cells = [_cell("test_naive_visible", "assert True"), _cell("test_naive_hidden", hidden)]
    return Plan.of("06", nb), nb


CHEAT = [{"output_type": "execute_result", "data": {"text/plain": "3.0"}, "metadata": {}}]
NOISY = [{"output_type": "stream", "name": "stderr", "text": "UserWarning: chatty"}]


def test_a_judged_check_runs_once_and_vouches_for_its_quick_test():
    plan, nb = _plan()
    judge = FakeJudge(verdict_error=False, cell_outputs=NOISY)
    visible, _ = plan.grade(judge, 0, nb.cells[0])
    hidden, mark = plan.grade(judge, 1, nb.cells[1])
    assert judge.checked == ["check_naive"] and "judged" in mark
    assert hidden[0].output_type == "execute_result"
    # stderr from correct code is shown, not scored; no error, so nbgrader gives full points
    assert [o.output_type for o in visible] == ["stream", "stream"]
    assert all(o.name == "stdout" for o in visible) and "[stderr]" in visible[0].text


def test_a_quick_test_made_to_pass_in_the_notebook_needs_the_judges_pass():
    plan, nb = _plan()
    visible, _ = plan.grade(FakeJudge(verdict_error=True, cell_outputs=CHEAT), 0, nb.cells[0])
    assert [o.output_type for o in visible] == ["error"]  # the cell's own "3.0" is dropped


def test_the_lab_contract_lists_judged_labs_targets():
    assert {row.lab for row in all_targets()} >= {"06", "09"}
    assert module("06").JUDGED and module("09").JUDGED


def test_labs_that_time_baselines_start_their_twin_with_the_worker():
    from ptcourse.judge.judge import _times_in_twin

    timed = {each.LAB.number for each in written() if _times_in_twin(each.LAB.number)}
    assert {"01", "03", "04", "06", "08", "09", "10"} <= timed
    assert not {"00", "05"} & timed  # no speed or memory row: no twin to pay for


def test_a_twin_started_early_answers_once_asked(make_worker):
    worker = make_worker()
    early = worker.twin(wait=False)
    assert early.running and not early.answered
    assert worker.twin() is early and early.answered  # the same process, now ready
    assert early.request("ping") is True
    worker.kill()
    assert not early.running


def test_a_cell_past_its_time_is_interrupted_and_the_worker_keeps_its_state(make_worker):
    from ptcourse.judge.judge import Judge

    judge = Judge(make_worker(), cell_timeout=2.0)
    judge.run_cell(0, "kept = 41")
    outputs = judge.run_cell(1, "while True:\n    pass")
    assert [o.output_type for o in outputs][-2:] == ["error", "error"]  # KeyboardInterrupt, note
    assert "ran past 2 s" in outputs[-1].evalue
    assert judge.run_cell(2, "print(kept + 1)")[0].text == "42\n" and not judge.log


def test_a_cell_that_ignores_interrupts_costs_only_itself(make_worker):
    from ptcourse.judge.judge import Judge

    judge = Judge(make_worker(), cell_timeout=1.0)
    judge.run_cell(0, "kept = 41")
    stuck = "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass"
    outputs = judge.run_cell(1, stuck)
    assert "ignored interrupts" in outputs[-1].evalue
    assert judge.run_cell(2, "print(kept + 1)")[0].text == "42\n"  # replayed on a fresh worker
    assert judge.log == ["worker restarted; replayed 1 cells"]


def test_a_check_that_ends_the_worker_costs_no_later_cell(make_worker):
    """A check's call into a looping answer ends the worker after a cell's time; the next cell
    runs on a fresh worker that replays what finished (not the cell that timed out, which
    would time out again in every replay), instead of being blamed for the dead worker."""
    import time

    from ptcourse.judge.judge import Judge
    from ptcourse.judge.remote import WorkerGone

    worker = make_worker()
    worker.call_timeout = 1.0
    judge = Judge(worker, cell_timeout=1.0)
    judge.run_cell(0, "kept = 41\ndef spin():\n    while True:\n        pass")
    judge.run_cell(1, "spin()")  # interrupted past its time
    started = time.monotonic()
    with pytest.raises(WorkerGone):
        worker.request("lookup", "spin")()  # a check's call: no reply within call_timeout
    assert time.monotonic() - started < 10 and not worker.running
    assert judge.run_cell(2, "print(kept + 1)")[0].text == "42\n"
    assert judge.log == ["worker restarted; replayed 1 cells"]


def test_the_worker_sees_the_cpu_the_judge_sees(tmp_path, monkeypatch):
    """ATEN_CPU_CAPABILITY and friends reach the worker: otherwise a candidate would run other
    kernels than the baseline and reference timed beside it."""
    from judged import readable

    from ptcourse.judge.judge import judge_notebook

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    nb = nbformat.v4.new_notebook()
    code = "import os, torch\n"
    code += "print(torch.backends.cpu.get_cpu_capability(), os.environ['ONEDNN_MAX_CPU_ISA'])"
    nb.cells = [nbformat.v4.new_code_cell(code)]
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "language": "python",
        "display_name": "Python 3",
    }
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    (tmp_path / "submission").mkdir()
    out = judge_notebook(
        "06", path, tmp_path / "submission", tmp_path / "scratch",
        cell_timeout=120, hidden=[], readable=readable(),
    )  # fmt: skip
    assert out.cells[0].outputs[-1].text == "DEFAULT AVX2\n"


def test_a_judge_without_a_control_group_says_so(tmp_path, monkeypatch):
    from judged import readable

    from ptcourse.judge.judge import judge_notebook

    monkeypatch.setenv("PTCOURSE_ACCOUNTING", "proc")
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print(1)")]
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Py"}
    path = tmp_path / "nb.ipynb"
    nbformat.write(nb, path)
    (tmp_path / "submission").mkdir()
    out = judge_notebook(
        "06", path, tmp_path / "submission", tmp_path / "scratch",
        cell_timeout=120, hidden=[], readable=readable(),
    )  # fmt: skip
    assert out.metadata["ptcourse"]["accounting"].startswith("per process")
