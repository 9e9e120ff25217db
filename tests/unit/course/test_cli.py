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


@pytest.mark.parametrize(
    "command",
    ["doctor", "data", "release", "run", "grade", "check", "progress", "answers", "lab", "targets"],
)
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


UNKNOWN_LAB = (
    "ptcourse: error: no lab '99': name one by number (06) or name (06-attention); "
    "the labs are 00-measuring-right, 01-data-loading,"
)


def test_an_unknown_lab_is_one_line_not_a_traceback():
    done = ptcourse("run", "99")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(UNKNOWN_LAB) and done.stderr.count("\n") == 1, done.stderr


@pytest.mark.parametrize(
    "argv", [["run", "99"], ["run", "--smoke", "99"], ["release", "99"], ["grade", "SUBS", "99"]]
)
def test_every_command_says_an_unknown_lab_in_one_line(argv, tmp_path, capsys):
    (tmp_path / "alice").mkdir()
    assert cli.main([str(tmp_path) if a == "SUBS" else a for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith(UNKNOWN_LAB) and err.endswith("13-capstone\n") and err.count("\n") == 1


def test_an_unknown_dataset_is_one_line_before_any_is_built(monkeypatch, capsys):
    from ptcourse.assets import datasets

    built = []
    monkeypatch.setattr(datasets, "ensure", lambda name, smoke: built.append(name))
    assert cli.main(["data", "inspection", "nosuchset"]) == 2
    assert built == []
    assert capsys.readouterr().err == (
        "ptcourse: error: unknown dataset 'nosuchset': the datasets are headlines, inspection\n"
    )


def test_grading_a_students_own_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "alice" / "06-attention").mkdir(parents=True)
    assert cli.main(["grade", str(tmp_path / "alice"), "06"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ptcourse: error: {tmp_path / 'alice'} holds lab folders (06-attention)")
    assert "grade the folder above it" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "argv,said",
    [
        (["grade", ".", "--lanes", "0"], "argument --lanes: '0' is not a whole number above 0"),
        (["grade", ".", "--timeout", "-1"], "argument --timeout: '-1' is not a number above 0"),
        (["run", "--lanes", "two"], "argument --lanes: 'two' is not a whole number above 0"),
    ],
)
def test_lanes_and_timeouts_must_be_above_zero(argv, said, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(said)


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


def test_an_empty_lab_key_names_no_lab():
    from ptcourse.core.lineup import UnknownLab, lab

    assert lab("0") == lab("00")
    with pytest.raises(UnknownLab):
        lab("")
