import pytest

from ptcourse.core import hardware
from ptcourse.core.lineup import LABS, lab


def test_every_lab_resolves_to_a_cpu_track_here_with_a_reason():
    for each in LABS:
        track = hardware.track_for(each)
        assert track.name in {"cpu", "cpu-basic"}
        assert track.reason


def test_doctor_prints_every_lab_and_backend(capsys):
    text = hardware.doctor_report()
    for each in LABS:
        assert each.name in text
    for name in hardware.BACKENDS:
        assert name in text


def test_missing_backend_is_reported_not_raised(monkeypatch):
    hardware.backend.cache_clear()
    monkeypatch.setitem(hardware.BACKENDS, "dali", "no_such_module_xyz")
    try:
        found = hardware.backend("dali")
        assert not found.available and "ModuleNotFoundError" in found.detail
    finally:
        hardware.backend.cache_clear()


def test_cuda_branch_when_cuda_is_present(monkeypatch):
    monkeypatch.setattr(hardware, "_cuda", lambda: hardware.Cuda(True, "Fake GPU", "9.0", 80))
    assert hardware.track_for("06").name == "cuda"
    # A GPU track that also needs TensorRT falls back when TensorRT is absent.
    monkeypatch.setattr(hardware, "backend", lambda name: hardware.Backend(name, False))
    track = hardware.track_for("08")
    assert track.name == "cpu" and "tensorrt" in track.reason


def test_labs_without_gpu_track_stay_on_cpu(monkeypatch):
    monkeypatch.setattr(hardware, "_cuda", lambda: hardware.Cuda(True, "Fake GPU", "9.0", 80))
    assert hardware.track_for("10").name == "cpu"


def test_cpu_basic_track_when_cpu_backend_missing(monkeypatch):
    monkeypatch.setattr(hardware, "backend", lambda name: hardware.Backend(name, False))
    assert hardware.track_for("02").name == "cpu-basic"


def test_lab_lookup():
    assert lab("1").name == lab("01-data-loading").name == lab("data-loading").name
    with pytest.raises(KeyError):
        lab("99")
