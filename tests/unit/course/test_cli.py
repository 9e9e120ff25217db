import subprocess
import sys

import pytest

from ptcourse.course import cli


def ptcourse(*args, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "ptcourse.course.cli", *args],
        capture_output=True,
        text=True,
        **kwargs,
    )


def test_doctor_prints_machine_backends_and_tracks():
    done = ptcourse("doctor")
    assert done.returncode == 0, done.stderr
    for needle in ("CPU flags", "CUDA", "dali", "torchao", "00-measuring-right", "track"):
        assert needle in done.stdout


@pytest.mark.parametrize("command", ["doctor", "data", "release", "run", "grade", "lab", "targets"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([command, "--help"])
    assert done.value.code == 0
    assert "usage: ptcourse" in capsys.readouterr().out


def test_data_builds_and_verifies_smoke_datasets(tmp_path):
    env = {**__import__("os").environ, "PTCOURSE_DATA": str(tmp_path)}
    done = ptcourse("data", "--smoke", env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "inspection" in done.stdout and "headlines" in done.stdout
    assert "verified" in done.stdout


def test_grade_rejects_missing_folder(tmp_path):
    assert ptcourse("grade", str(tmp_path / "nope")).returncode == 2


def test_lanes_get_disjoint_cores():
    from ptcourse.course.lanes import core_plan

    assert core_plan(list(range(8)), 4) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert core_plan([0, 1], 2) == [[0], [1]]
    assert core_plan([0, 1], 5) == [[0], [1]]  # never more lanes than cores
    assert core_plan([3], 1) == [[3]]
    plan = core_plan(list(range(16)), 3)
    assert all(len(cores) == 5 for cores in plan)
    assert len({c for cores in plan for c in cores}) == 15


def test_a_surprise_while_grading_one_submission_fails_only_that_one(monkeypatch, tmp_path):
    from ptcourse.core.lineup import lab
    from ptcourse.course import autograde

    def broken(*args, **kwargs):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    monkeypatch.setattr(autograde, "_books", broken)
    score = autograde._autograde_one(lab("00"), "mallory", tmp_path, timeout_s=5)
    assert score.status == "failed"
    assert "UnicodeDecodeError" in score.detail


@pytest.mark.parametrize(
    "argv", [["--allow-root", "--no-browser"], ["--", "--allow-root", "--no-browser"]]
)
def test_lab_passes_jupyters_own_options_through(monkeypatch, argv):
    from ptcourse.assets import datasets

    started = []
    monkeypatch.setattr(datasets, "ensure", lambda name, smoke: None)
    monkeypatch.setattr(cli.os, "execv", lambda path, command: started.append(command))
    cli.main(["lab", *argv])
    assert started[0][-2:] == ["--allow-root", "--no-browser"]


def test_other_commands_still_refuse_unknown_options():
    with pytest.raises(SystemExit):
        cli.main(["targets", "--allow-root"])


def test_executed_notebooks_keep_cell_stderr_but_not_the_kernels_transport_warning(tmp_path, capfd):
    import nbformat
    import papermill

    from ptcourse.course import execute

    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import sys\nprint('x', file=sys.stderr)")]
    )
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nbformat.write(nb, tmp_path / "in.ipynb")
    papermill.execute_notebook(
        str(tmp_path / "in.ipynb"), str(tmp_path / "out.ipynb"), kernel_name="python3",
        progress_bar=False, extra_arguments=execute.QUIET_KERNEL,
    )  # fmt: skip
    assert "without encryption" not in capfd.readouterr().err
    (cell,) = nbformat.read(tmp_path / "out.ipynb", as_version=4).cells
    assert cell.outputs[0]["name"] == "stderr" and cell.outputs[0]["text"] == "x\n"


def test_lanes_run_each_notebook_in_its_own_pinned_child_and_report_failures():
    """`ptcourse run --lanes 2`: each lab in a child process on its lane's core; a lab that
    cannot run comes back as a failed run with its error, and the others still run."""
    from ptcourse.core.lineup import lab
    from ptcourse.course import execute

    seen = []
    runs = execute.execute_in_lanes(
        [lab("04"), lab("07")], True, "no-such-folder", 2, lambda run, n, total: seen.append(n)
    )
    assert [r.lab for r in runs] == ["04-grad-accumulation", "07-export"]
    assert not any(r.ok for r in runs) and all("no-such-folder" in r.error for r in runs)
    assert sorted(seen) == [1, 2]
