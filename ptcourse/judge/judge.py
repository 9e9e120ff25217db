"""The judge: the authoritative score of one submission, from a process no student code runs in.

The submission's cells run in a sandboxed worker (:mod:`ptcourse.judge.worker`), one at a time.
Each autograded test cell whose check the lab lists in its ``JUDGED`` runs here instead: the
judge reads the cell's hidden call (``fresh("06").check_speed(attention_sdpa, points=3)``),
looks the named answers up in the worker — data comes back as data, functions and modules as
:class:`~ptcourse.judge.remote.Remote` references — and calls the lab module's check with them.
The check draws its secret inputs, computes the expected outputs and holds the clock here. The
cell's outputs become the judge's line and points, which nbgrader then reads like any test
cell's. A test cell whose check is not judged yet runs in the worker (sandboxed, but in the same
process as the student's code) and is marked so.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nbformat

from ptcourse.grading.checks import SEED_ENV, CheckFailed
from ptcourse.judge import sandbox
from ptcourse.judge.remote import WorkerError, WorkerGone, WorkerLate, WorkerProcess

BEGIN, END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
UNSANDBOXED = "UNSANDBOXED (no bubblewrap here: student code could reach the whole machine)"
PER_PROCESS = (
    "PER-PROCESS ACCOUNTING (no control group could be made here: time and memory are summed "
    "over the worker's processes as /proc lists them, and a short-lived child can escape them)"
)
GRACE_S = 10.0
# glibc's heap, fixed alike for the worker and its twin. Left to itself it adapts to what a
# process has allocated so far: the worker, which ran the whole notebook, kept freed memory
# that the fresh twin returned and faulted in again on every call, and the same fp32 model ran
# 1.2-1.4x faster in the worker than as the baseline in the twin (Lab 08's bf16 baseline copy
# 1.29-1.41x, Lab 12's eager copy 1.11-1.31x, Intel AMX VM, 2026-12-07). A lab that pins the
# heap in its setup cell (measure.rss_follows_tensors) overrides this in both.
HEAP = {"MALLOC_MMAP_THRESHOLD_": str(32 * 2**20), "MALLOC_TRIM_THRESHOLD_": str(256 * 2**20)}
# What the worker inherits: the course's switches and what decides which kernels run, so that
# the worker and the judge (its baseline, its reference) see the same CPU.
WORKER_ENV = ("PTCOURSE_", "ATEN_", "ONEDNN_", "DNNL_", "OMP_", "MKL_", "KMP_", "CUDA_")


@dataclass(frozen=True)
class HiddenCall:
    """What a hidden test cell asks for: ``fresh(lab).check(*names, points=points)``."""

    lab: str
    check: str
    names: tuple[str, ...]
    points: float


def hidden_call(source: str) -> HiddenCall | None:
    if BEGIN not in source:
        return None
    block = source.split(BEGIN, 1)[1].split(END, 1)[0]
    for node in ast.walk(ast.parse(block)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        inner = node.func.value
        if isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "fresh":
            points = next(k.value for k in node.keywords if k.arg == "points")
            return HiddenCall(
                inner.args[0].value,
                node.func.attr,
                tuple(arg.id for arg in node.args),
                float(points.value),
            )
    return None


def _is_test(cell: Any) -> bool:
    meta = cell.metadata.get("nbgrader", {})
    return cell.cell_type == "code" and meta.get("grade") and not meta.get("solution")


def _notebook_outputs(outputs: Any) -> list[Any]:
    """The worker's outputs as notebook outputs (they are data the student controls: only the
    fields nbformat knows are kept)."""
    return [nbformat.from_dict(each) for each in outputs if isinstance(each, dict)]


def _stderr_as_feedback(output: Any) -> Any:
    """stderr in a test cell (a warning from correct code) is shown, not scored: nbgrader would
    give the cell 0 for it."""
    if output.output_type == "stream" and output.name == "stderr":
        return _stream("".join(f"[stderr] {line}\n" for line in output.text.splitlines()))
    return output


def _stream(text: str, name: str = "stdout") -> dict[str, Any]:
    return nbformat.v4.new_output("stream", name=name, text=text)


def _error(name: str, message: str) -> dict[str, Any]:
    return nbformat.v4.new_output("error", ename=name, evalue=message, traceback=[message])


def _result(points: float) -> dict[str, Any]:
    return nbformat.v4.new_output("execute_result", data={"text/plain": repr(points)})


@dataclass
class Judge:
    """Runs cells in the worker (restarting it when a cell kills or hangs it) and checks here."""

    worker: WorkerProcess
    cell_timeout: float
    replay: list[tuple[int, str]] = field(default_factory=list)
    log: list[str] = field(default_factory=list)

    def run_cell(self, index: int, source: str) -> list[dict[str, Any]]:
        if not self.worker.running:  # ended by an earlier check: not this cell's fault
            self.restart()
        try:
            outputs, finished = self._in_worker(index, source)
        except WorkerGone as gone:
            self.restart()
            return [_error("CellFailed", f"this cell ended the worker: {gone}")]
        if finished:  # a cell interrupted past its time would time out again in every replay
            self.replay.append((index, source))
        return outputs

    def _in_worker(self, index: int, source: str) -> tuple[list[dict[str, Any]], bool]:
        self.worker.send("cell", source, index)
        try:
            reply = self.worker.receive(self.cell_timeout, keep_if_late=True)
            return _notebook_outputs(reply["outputs"]), True
        except WorkerLate:
            self.worker.interrupt()  # past its time: KeyboardInterrupt, then a grace period
        try:
            outputs = _notebook_outputs(self.worker.receive(GRACE_S)["outputs"])
        except WorkerGone as gone:
            late = f"it ran past {self.cell_timeout:g} s and ignored interrupts"
            raise WorkerGone(late) from gone
        note = f"this cell ran past {self.cell_timeout:g} s and was interrupted"
        return [*outputs, _error("CellTimeout", note)], False

    def restart(self) -> None:
        """A fresh worker that has run every cell that completed so far (outputs dropped)."""
        self.worker.kill()
        self.worker.start()
        for index, source in self.replay:
            with contextlib.suppress(WorkerGone, WorkerError):
                self.worker.request("cell", source, index, timeout=self.cell_timeout)
        self.log.append(f"worker restarted; replayed {len(self.replay)} cells")

    def judge_cell(self, call: HiddenCall) -> list[dict[str, Any]]:
        from ptcourse.labs import module as lab_module

        module = lab_module(call.lab)  # no student code runs here: nothing to reload
        printed = io.StringIO()
        try:
            answers = [self.worker.request("lookup", name) for name in call.names]
            with contextlib.redirect_stdout(printed):
                points = float(getattr(module, call.check)(*answers, points=call.points))
        except CheckFailed as failed:
            return [_stream(printed.getvalue()), _error("CheckFailed", str(failed))]
        except WorkerError as error:
            return [_stream(printed.getvalue()), _error("SubmissionError", str(error))]
        except WorkerGone as gone:
            return [_stream(printed.getvalue()), _error("SubmissionError", str(gone))]
        except Exception as error:  # noqa: BLE001 - e.g. an answer of the wrong kind
            message = f"the check could not use the answer: {type(error).__name__}: {error}"
            return [_stream(printed.getvalue()), _error("CheckFailed", message)]
        finally:
            if not self.worker.running:  # a call past its time ended it, whoever caught that
                self.restart()
            self.worker.freeze()
        return [_stream(printed.getvalue()), _result(points)]


def judge_notebook(
    key: str,
    notebook: Path,
    submission: Path,
    scratch: Path,
    *,
    cell_timeout: float,
    hidden: list[Path],
    readable: list[Path],
) -> nbformat.NotebookNode:
    """Run ``notebook`` (nbgrader's canonical copy, hidden tests included) cell by cell: the
    worker executes the submission's cells, the judge its judged checks. Returns it with outputs."""
    missing = sandbox.unavailable()
    env = {k: v for k, v in os.environ.items() if k.startswith(WORKER_ENV)}
    env.pop("PTCOURSE_RESULTS", None)
    env.pop(SEED_ENV, None)  # the secret stays here: the worker's inputs come from the judge
    env.update(HEAP)
    env.update(_compiler_env(key))
    worker = WorkerProcess(
        submission, scratch, env, readable, hidden, sandbox.limits_from_env(), missing is None
    )
    worker.call_timeout = cell_timeout  # a check's call into the submission gets a cell's time
    worker.launch()
    if _times_in_twin(key):
        worker.twin(wait=False)  # boots beside the worker instead of inside the first timed check
    judge = Judge(worker.ready(), cell_timeout)
    nb = nbformat.read(notebook, as_version=4)
    plan = Plan.of(key, nb)
    try:
        for index, cell in enumerate(nb.cells):
            if cell.cell_type == "code":
                started = time.monotonic()
                cell.outputs, mark = plan.grade(judge, index, cell)
                if mark and not worker.accounting.exact:
                    cell.outputs.insert(0, _stream(f"{PER_PROCESS}\n"))
                if mark and missing:
                    cell.outputs.insert(0, _stream(f"{UNSANDBOXED}: {missing}\n"))
                cell.metadata["ptcourse"] = {
                    "graded": mark,
                    "sandboxed": missing is None,
                    "seconds": round(time.monotonic() - started, 2),
                }
    finally:
        worker.kill()
    nb.metadata["ptcourse"] = {
        "judge_log": judge.log,
        "sandbox": missing or "bubblewrap",
        "accounting": worker.accounting.kind,
    }
    return nb


def _compiler_env(key: str) -> dict[str, str]:
    """For a lab that compiles with inductor: the outcome of inductor's CPU probe, made here
    (a persistent cache folder) so the sandboxed worker and twin do not each redo it."""
    from ptcourse.core import hardware, lineup

    needs = lineup.lab(key).cpu_needs
    return hardware.inductor_probe_env() if "cxx_compiler" in needs else {}


def _times_in_twin(key: str) -> bool:
    """The lab grades a speedup or a memory ratio: its checks run baselines in the twin."""
    from ptcourse.labs import module

    return any(t.kind in ("speedup", "memory_ratio") for t in module(key).TARGETS)


@dataclass
class Plan:
    """Who grades which cell: ``JUDGED`` checks run in the judge; a quick-test cell listed in
    ``VOUCHED`` runs in the worker (its feedback) and keeps its points only if the judge's
    check of the same answer passes; everything else runs in the worker."""

    calls: dict[str, HiddenCall]
    judged: set[str]
    vouched: dict[str, str]
    verdicts: dict[str, list[Any]] = field(default_factory=dict)

    @classmethod
    def of(cls, key: str, nb: nbformat.NotebookNode) -> Plan:
        from ptcourse.labs import module

        lab_module = module(key)
        found = [hidden_call(cell.source) for cell in nb.cells if _is_test(cell)]
        calls = {call.check.removeprefix("check_"): call for call in found if call}
        judged = set(getattr(lab_module, "JUDGED", ()))
        return cls(calls, judged, dict(getattr(lab_module, "VOUCHED", {})))

    def verdict(self, judge: Judge, check: str) -> list[Any]:
        if check not in self.verdicts:
            self.verdicts[check] = judge.judge_cell(self.calls[check])
        return self.verdicts[check]

    def grade(self, judge: Judge, index: int, cell: Any) -> tuple[list[Any], str]:
        call = hidden_call(cell.source) if _is_test(cell) else None
        check = call.check.removeprefix("check_") if call else None
        if check in self.judged:
            # The cell's visible part runs first, in the worker: it is feedback, and it may
            # define what the check grades (Lab 07 exports its median model there). Its error
            # zeroes the cell, as it would in a notebook.
            mark = "judged outside the notebook's process"
            feedback: list[Any] = []
            visible = cell.source.split(BEGIN, 1)[0]
            if visible.strip():
                ran = [_stderr_as_feedback(o) for o in judge.run_cell(index, visible)]
                feedback = [o for o in ran if o.output_type in ("stream", "display_data")]
                failed = [o for o in ran if o.output_type == "error"]
                if failed:
                    return [*feedback, failed[0]], mark
            return [*feedback, *self.verdict(judge, check)], mark
        outputs = judge.run_cell(index, cell.source)
        if _is_test(cell):
            outputs = [_stderr_as_feedback(o) for o in outputs]
        voucher = self.vouched.get(cell.metadata.get("nbgrader", {}).get("grade_id", ""))
        if voucher in self.judged and voucher in self.calls:
            # The cell's own verdict (its value, its errors) stays feedback: nbgrader reads the
            # first error or value it finds, so only the judge's line may carry one.
            feedback = [o for o in outputs if o.output_type in ("stream", "display_data")]
            failed = [o for o in outputs if o.output_type == "error"]
            passed = _full_credit(self.verdict(judge, voucher), self.calls[voucher].points)
            note = f"the judge's check of the same answer ({voucher}) "
            if passed and not failed:
                return [*feedback, _stream(note + "gave full credit\n")], "vouched for by the judge"
            why = (
                f"{failed[0].ename}: {failed[0].evalue}"
                if failed
                else note + "gave less than full credit"
            )
            return [*feedback, _error("CheckFailed", why)], "vouched for by the judge"
        return outputs, "in the notebook's process" if call else ""


def _full_credit(verdict: list[Any], points: float) -> bool:
    """Whether a judged cell's outputs give its full points: no error, and a value (nbgrader's
    partial credit) of at least ``points``."""
    if any(o.output_type == "error" for o in verdict):
        return False
    values = [o for o in verdict if o.output_type == "execute_result"]
    try:
        return bool(values) and float(values[-1].data["text/plain"]) >= points
    except (KeyError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    """``python -m ptcourse.judge.judge KEY NOTEBOOK SUBMISSION SCRATCH OUT HIDDEN READABLE``:
    one fresh judge process per submission (``ptcourse grade`` starts it). HIDDEN and READABLE
    are folder lists joined with ``os.pathsep``."""
    from ptcourse.assets import datasets

    key, notebook, submission, scratch, out, hidden, readable = argv or sys.argv[1:]
    for name in datasets.SEEDS:  # built here: the worker sees them read-only
        datasets.ensure(name, quiet=True)
    nb = judge_notebook(
        key,
        Path(notebook),
        Path(submission),
        Path(scratch),
        cell_timeout=float(os.environ.get("PTCOURSE_CELL_TIMEOUT", "300")),
        hidden=[Path(p) for p in hidden.split(os.pathsep) if p],
        readable=[Path(p) for p in readable.split(os.pathsep) if p],
    )
    nbformat.write(nb, out)


if __name__ == "__main__":
    main()
