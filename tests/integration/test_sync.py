"""labs/ is exactly what nbgrader generates from solutions/ — nobody edits it by hand."""

import pytest
from labs_under_test import selected_labs

from ptcourse.course import paths, release

LABS = paths.course_labs(selected_labs())


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory):
    folder = tmp_path_factory.mktemp("release")
    release.release(release_dir=folder)
    return folder


@pytest.mark.parametrize("lab", LABS, ids=lambda x: x.name)
def test_labs_match_generated(lab, regenerated):
    committed = sorted(p.name for p in (paths.ROOT / "labs" / lab.name).iterdir())
    generated = sorted(p.name for p in (regenerated / lab.name).iterdir())
    assert committed == generated
    for name in generated:
        expected = (regenerated / lab.name / name).read_bytes()
        actual = (paths.ROOT / "labs" / lab.name / name).read_bytes()
        assert actual == expected, f"labs/{lab.name}/{name} differs: run `ptcourse release`"
