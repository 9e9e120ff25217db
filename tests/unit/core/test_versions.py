"""constraints.txt: the versions the suite runs on, and what ``ptcourse doctor`` says of them."""

import pytest

from ptcourse.core import hardware, versions


def test_every_key_package_is_pinned_exactly():
    pins = versions.pinned()
    missing = [name for name in versions.KEY_PACKAGES if name not in pins]
    assert not missing, f"constraints.txt pins none of {missing}: run tools/lock.py"


def test_the_suite_runs_on_the_pinned_versions():
    off = ", ".join(f"{v.name} {v.installed} != {v.pinned}" for v in versions.mismatches())
    assert not off, (
        "installed versions differ from constraints.txt (install with "
        "`pip install -e '.[test]' -c constraints.txt`, or run tools/lock.py after the suite "
        "passes on the new ones): " + off
    )


def test_names_compare_as_pip_compares_them():
    assert versions.canonical("Jinja2") == versions.canonical("jinja2")
    assert versions.canonical("nvidia_dali.cuda120") == "nvidia-dali-cuda120"


def test_a_constraint_that_is_not_an_exact_pin_is_refused(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text("# comment\ntorch==2.0  # inline\nnumpy>=2\n")
    with pytest.raises(ValueError, match="numpy>=2"):
        versions.pinned(path)


def test_doctor_reports_a_drifted_package(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text(f"torch=={versions.installed('torch')}\nnumpy==0.0.1\n")
    lines = "\n".join(versions.report_lines(path))
    assert "1 installed package(s) differ" in lines
    assert "numpy" in lines and "constraints.txt pins 0.0.1" in lines
    assert "torch" in lines and "(as pinned)" in lines


def test_doctor_says_when_there_is_no_lock_file(tmp_path):
    assert "no constraints.txt" in "\n".join(versions.report_lines(tmp_path / "constraints.txt"))


def test_doctor_shows_the_versions_section():
    assert "Versions" in hardware.doctor_report()
