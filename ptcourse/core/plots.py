"""The matplotlib plots labs share. Each returns its Axes, draws into ``ax`` when given (else a
new figure) and never calls ``plt.show()``: the notebook displays the figure itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullLocator

PASS_COLOR = "#2a9d8f"
FAIL_COLOR = "#e76f51"
NEUTRAL_COLOR = "#4c72b0"
TARGET_COLOR = "#c1121f"


def _axes(ax: Axes | None, figsize: tuple[float, float] = (7.0, 4.2)) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize, layout="constrained")
    return ax


def _plain_number(value: float, _pos: object = None) -> str:
    """Tick labels such as 0.5, 64, 4096, 1e+06 instead of 2^6 or 10^3."""
    return f"{value:g}"


def _target_line(ax: Axes, target: float, label: str) -> None:
    ax.axhline(target, color=TARGET_COLOR, linestyle="--", linewidth=1.5, label=label, zorder=3)


def speedup_bars(
    results: Mapping[str, Any],
    target: float | None = None,
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Bars of measured speedups with their confidence intervals.

    ``results`` maps a name to an object with ``.ratio``, ``.ci_low`` and ``.ci_high``. With a
    ``target``, a bar passes (green) when its whole interval is at or above the target
    (``ci_low >= target``) and fails (orange) otherwise.
    """
    ax = _axes(ax, figsize=(8.5, 4.2))
    names = list(results)
    ratios = np.array([results[n].ratio for n in names], dtype=float)
    lows = np.array([results[n].ci_low for n in names], dtype=float)
    highs = np.array([results[n].ci_high for n in names], dtype=float)
    if target is None:
        colors = [NEUTRAL_COLOR] * len(names)
    else:
        colors = [PASS_COLOR if lo >= target else FAIL_COLOR for lo in lows]

    x = np.arange(len(names))
    yerr = np.vstack([np.clip(ratios - lows, 0, None), np.clip(highs - ratios, 0, None)])
    ax.bar(x, ratios, color=colors, width=0.6, zorder=2)
    ax.errorbar(x, ratios, yerr=yerr, fmt="none", ecolor="black", capsize=6, lw=1.2, zorder=4)
    for xi, r, hi in zip(x, ratios, highs, strict=True):
        ax.annotate(
            f"{r:.2f}x",
            (xi, max(r, hi)),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            va="bottom",
            fontsize=9,
        )

    ax.axhline(1.0, color="0.3", linewidth=1.0, label="1x (no change)", zorder=3)
    handles = []
    if target is not None:
        _target_line(ax, target, f"target {target:g}x")
        handles = [
            Patch(color=PASS_COLOR, label="pass (CI low ≥ target)"),
            Patch(color=FAIL_COLOR, label="below target"),
        ]
    ax.set_xticks(x, names)
    if max((len(n) for n in names), default=0) * len(names) > 60:
        ax.tick_params(axis="x", labelrotation=20)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
    top = max([1.0, target or 0.0, *highs, *ratios])
    ax.set_ylim(0, top * 1.18)
    ax.set_ylabel("speedup (x, higher is better)")
    ax.grid(axis="y", alpha=0.3, zorder=0)
    # outside the axes, so it never hides a tall bar or its label
    ax.legend(
        handles=ax.get_legend_handles_labels()[0] + handles,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        fontsize=9,
    )
    ax.set_title(title or "Measured speedup with confidence interval")
    return ax


def metric_vs_knob(
    knob_values: Sequence[Any],
    values: Sequence[float],
    lows: Sequence[float] | None = None,
    highs: Sequence[float] | None = None,
    knob: str = "",
    metric: str = "",
    ax: Axes | None = None,
    target: float | None = None,
    logx: bool = False,
    title: str | None = None,
) -> Axes:
    """A measured metric (e.g. images/s) against a swept knob (e.g. num_workers).

    ``lows``/``highs`` (both or neither) draw the interval as error bars and a shaded band;
    ``target`` draws a dashed target line.
    """
    ax = _axes(ax)
    if (lows is None) != (highs is None):
        raise ValueError("give both lows and highs, or neither")
    numeric = all(isinstance(v, int | float | np.number) for v in knob_values)
    # categorical knobs (e.g. "fp32", "bf16") are placed at 0..n-1 and labelled
    x = np.asarray(knob_values, dtype=float) if numeric else np.arange(len(knob_values))
    y = np.asarray(values, dtype=float)
    label = metric or "measured"
    if lows is not None:
        lo, hi = np.asarray(lows, dtype=float), np.asarray(highs, dtype=float)
        ax.fill_between(x, lo, hi, color=NEUTRAL_COLOR, alpha=0.15, label="interval", zorder=1)
        yerr = np.vstack([np.clip(y - lo, 0, None), np.clip(hi - y, 0, None)])
        ax.errorbar(x, y, yerr=yerr, fmt="o-", color=NEUTRAL_COLOR, capsize=4, label=label)
    else:
        ax.plot(x, y, "o-", color=NEUTRAL_COLOR, label=label)
    if target is not None:
        _target_line(ax, target, f"target {target:g}")

    if logx:
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))
    if not numeric or len(x) <= 12:
        ax.set_xticks(x, [str(v) for v in knob_values])
    ax.set_xlabel(knob)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=9)
    ax.set_title(title or (f"{metric} vs {knob}" if metric and knob else ""))
    return ax


def _vs_size(
    sizes: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    ax: Axes | None,
    size_label: str,
    ylabel: str,
    logx: bool,
    logy: bool,
    title: str | None,
) -> Axes:
    ax = _axes(ax)
    x = np.asarray(sizes, dtype=float)
    markers = "osD^vP*X"
    for i, (name, vals) in enumerate(series.items()):
        # a series may stop early or hold None where an implementation ran out of memory
        y = np.array([np.nan if v is None else v for v in vals], dtype=float)
        ax.plot(x[: len(y)], y, marker=markers[i % len(markers)], label=name)
    if logx:
        ax.set_xscale("log", base=2)
    if logy:
        ax.set_yscale("log")
    ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    if len(x) <= 12:
        ax.set_xticks(x)
        ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel(size_label)
    ax.set_ylabel(ylabel)
    ax.grid(which="major", alpha=0.3)
    ax.grid(which="minor", axis="y", alpha=0.1)
    ax.legend(fontsize=9)
    ax.set_title(title or "")
    return ax


def memory_vs_size(
    sizes: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    ax: Axes | None = None,
    size_label: str = "sequence length",
    logy: bool = True,
    logx: bool = True,
    title: str | None = None,
) -> Axes:
    """Peak memory (MB) against problem size, one line per implementation (log-log by default).

    A series may be shorter than ``sizes`` or hold None where that implementation did not run.
    """
    return _vs_size(
        sizes, series, ax, size_label, "peak memory (MB)", logx, logy, title or "Peak memory"
    )


def time_vs_size(
    sizes: Sequence[float],
    series: Mapping[str, Sequence[float | None]],
    ax: Axes | None = None,
    size_label: str = "sequence length",
    logy: bool = True,
    logx: bool = True,
    title: str | None = None,
) -> Axes:
    """Time (ms) against problem size, one line per implementation (log-log by default)."""
    return _vs_size(sizes, series, ax, size_label, "time (ms)", logx, logy, title or "Run time")


def _flops_unit(peak: float) -> tuple[float, str]:
    for scale, unit in ((1e12, "TFLOP/s"), (1e9, "GFLOP/s"), (1e6, "MFLOP/s")):
        if peak >= 10 * scale:
            return scale, unit
    return 1.0, "FLOP/s"


def roofline(
    peak_flops: float,
    bandwidth_bytes_per_s: float,
    points: Mapping[str, tuple[float, float]],
    ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Roofline: attainable FLOP/s = min(peak, bandwidth x intensity), log-log.

    ``points`` maps a name to (arithmetic intensity in FLOP/byte, achieved FLOP/s); each point is
    labelled with its share of the roof at its intensity.
    """
    ax = _axes(ax)
    scale, unit = _flops_unit(peak_flops)
    ridge = peak_flops / bandwidth_bytes_per_s
    intensities = [i for i, _ in points.values()] + [ridge]
    lo = 2.0 ** math.floor(math.log2(min(intensities) / 4))
    hi = 2.0 ** math.ceil(math.log2(max(intensities) * 4))
    xs = np.geomspace(lo, hi, 256)
    roof = np.minimum(peak_flops, bandwidth_bytes_per_s * xs)

    ax.plot(xs, roof / scale, color="black", linewidth=2, label="roof", zorder=3)
    memory = xs <= ridge
    ax.fill_between(xs[memory], 0, roof[memory] / scale, color="#8ecae6", alpha=0.25, zorder=0)
    ax.fill_between(xs[~memory], 0, roof[~memory] / scale, color="#ffb703", alpha=0.2, zorder=0)
    ax.axvline(ridge, color="0.4", linestyle=":", linewidth=1)
    ax.annotate(
        f"memory bound\n{bandwidth_bytes_per_s / 1e9:.3g} GB/s",
        (lo * 1.3, bandwidth_bytes_per_s * lo * 1.6 / scale),
        fontsize=9,
        rotation=0,
        va="bottom",
    )
    ax.annotate(
        f"compute bound, peak {peak_flops / scale:.3g} {unit}",
        (ridge * 1.15, peak_flops * 1.08 / scale),
        fontsize=9,
        va="bottom",
    )
    ax.annotate(
        f"ridge {ridge:.3g} FLOP/B",
        (ridge, 0),
        xycoords=("data", "axes fraction"),
        xytext=(3, 4),
        textcoords="offset points",
        fontsize=8,
        color="0.3",
    )

    markers = "osD^vP*X"
    for i, (name, (intensity, achieved)) in enumerate(points.items()):
        share = achieved / min(peak_flops, bandwidth_bytes_per_s * intensity)
        ax.scatter(
            intensity,
            achieved / scale,
            s=55,
            marker=markers[i % len(markers)],
            zorder=4,
            label=f"{name} ({share:.0%} of roof)",
        )

    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ymin = min([bandwidth_bytes_per_s * lo, *(a for _, a in points.values())]) / scale
    ax.set_ylim(ymin / 2, peak_flops * 3 / scale)
    ax.xaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.yaxis.set_major_formatter(FuncFormatter(_plain_number))
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel(f"attainable performance ({unit})")
    ax.grid(which="major", alpha=0.3)
    ax.legend(fontsize=9, loc="upper left")  # above the memory-bound slope: always empty
    ax.set_title(title or "Roofline")
    return ax
