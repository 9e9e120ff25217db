import matplotlib

matplotlib.use("Agg")  # before pyplot is imported anywhere: no display needed

from types import SimpleNamespace  # noqa: E402

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.container import BarContainer, ErrorbarContainer  # noqa: E402

from ptcourse.core import plots  # noqa: E402

SIZES = [128, 256, 512, 1024]


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _saved(ax: Axes, path) -> None:
    ax.figure.savefig(path)
    assert path.stat().st_size > 5000


def _labels(ax: Axes) -> list[str]:
    return [text.get_text() for text in ax.get_legend().get_texts()]


def _line(ax: Axes, label: str):
    return next(line for line in ax.get_lines() if line.get_label() == label)


def test_speedup_bars(tmp_path):
    results = {
        "fast": SimpleNamespace(ratio=2.0, ci_low=1.8, ci_high=2.2),
        "close": SimpleNamespace(ratio=1.6, ci_low=1.4, ci_high=1.8),
        "slow": SimpleNamespace(ratio=0.9, ci_low=0.8, ci_high=1.0),
    }
    ax = plots.speedup_bars(results, target=1.5, title="lab 01")
    assert isinstance(ax, Axes)
    (bars,) = [c for c in ax.containers if isinstance(c, BarContainer)]
    assert [b.get_height() for b in bars] == [2.0, 1.6, 0.9]
    colors = [b.get_facecolor() for b in bars]
    assert colors[0] != colors[1] and colors[1] == colors[2]  # only ci_low >= target passes
    (errs,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    segments = errs.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments] == [(1.8, 2.2), (1.4, 1.8), (0.8, 1.0)]
    assert _line(ax, "target 1.5x").get_linestyle() == "--"
    assert tuple(_line(ax, "target 1.5x").get_ydata()) == (1.5, 1.5)
    assert tuple(_line(ax, "1x (no change)").get_ydata()) == (1.0, 1.0)
    assert "target 1.5x" in _labels(ax)
    assert [t.get_text() for t in ax.get_xticklabels()] == list(results)
    assert ax.get_title() == "lab 01"
    _saved(ax, tmp_path / "speedup.png")


def test_speedup_bars_without_target_into_given_axes():
    _, given = plt.subplots()
    ax = plots.speedup_bars({"a": SimpleNamespace(ratio=1.2, ci_low=1.1, ci_high=1.3)}, ax=given)
    assert ax is given
    assert not any(line.get_label().startswith("target") for line in ax.get_lines())


def test_metric_vs_knob(tmp_path):
    ax = plots.metric_vs_knob(
        [0, 1, 2, 4],
        [400, 550, 700, 650],
        lows=[390, 500, 620, 560],
        highs=[410, 600, 760, 720],
        knob="num_workers",
        metric="images/s",
        target=600,
    )
    assert ax.get_xlabel() == "num_workers" and ax.get_ylabel() == "images/s"
    assert len([c for c in ax.containers if isinstance(c, ErrorbarContainer)]) == 1
    assert len(ax.collections) >= 2  # the band and the error bar segments
    assert "target 600" in _labels(ax)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "4"]
    _saved(ax, tmp_path / "knob.png")


def test_metric_vs_knob_categorical_and_log():
    ax = plots.metric_vs_knob(["fp32", "bf16"], [10.0, 20.0], knob="dtype", metric="samples/s")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["fp32", "bf16"]
    assert not ax.containers  # no interval, no error bars
    ax = plots.metric_vs_knob([1, 2, 4, 8], [1, 2, 3, 4], logx=True)
    assert ax.get_xscale() == "log"
    with pytest.raises(ValueError):
        plots.metric_vs_knob([1, 2], [1, 2], lows=[0, 1])


def test_memory_vs_size(tmp_path):
    series = {"naive": [3, 12, 50, 200], "sdpa": [1, 2, 4, None]}
    ax = plots.memory_vs_size(SIZES, series)
    assert len(ax.get_lines()) == 2
    assert all(line.get_marker() not in (None, "None", "") for line in ax.get_lines())
    assert _labels(ax) == ["naive", "sdpa"]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_ylabel() == "peak memory (MB)" and ax.get_xlabel() == "sequence length"
    _saved(ax, tmp_path / "memory.png")


def test_time_vs_size(tmp_path):
    ax = plots.time_vs_size(SIZES, {"naive": [1, 4, 16], "sdpa": [1, 2, 4, 8]}, logy=False)
    assert len(ax.get_lines()) == 2 and len(ax.get_lines()[0].get_xdata()) == 3
    assert ax.get_yscale() == "linear"
    assert ax.get_ylabel() == "time (ms)"
    _saved(ax, tmp_path / "time.png")


def test_roofline(tmp_path):
    points = {"matmul": (170.0, 65e9), "layer norm": (0.6, 8e9)}
    ax = plots.roofline(100e9, 20e9, points)
    roof = _line(ax, "roof")
    # memory-bound slope below the ridge (5 FLOP/B), flat at the peak above it
    assert max(roof.get_ydata()) == pytest.approx(100.0)
    assert min(roof.get_ydata()) < 100.0
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert "GFLOP/s" in ax.get_ylabel() and "FLOP/byte" in ax.get_xlabel()
    assert _labels(ax) == ["roof", "matmul (65% of roof)", "layer norm (67% of roof)"]
    _saved(ax, tmp_path / "roofline.png")
