"""The report card of a run: JSON for machines, one HTML page with plots for people."""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import asdict
from pathlib import Path

from ptcourse.core import hardware
from ptcourse.course.execute import LabRun
from ptcourse.grading.targets import LOWER_IS_BETTER


def _margin(result: dict) -> tuple[float, float, float]:
    """Measured value relative to its target (>= 1 passes), with the interval, for plotting."""
    value, low, high, goal = (result[k] for k in ("value", "ci_low", "ci_high", "target"))
    low, high = (value if low is None else low), (value if high is None else high)
    if result["kind"] in LOWER_IS_BETTER:
        scale = lambda x: goal / max(x, 1e-12)  # noqa: E731
        return scale(value), scale(high), scale(low)
    return value / goal, low / goal, high / goal


def _plot(run: LabRun) -> str:
    """A PNG (base64) of each check's measured value ÷ target, with its interval."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["check"] for r in run.results]
    margins = [_margin(r) for r in run.results]
    fig, ax = plt.subplots(figsize=(6, 0.5 + 0.45 * len(names)))
    ratios = [m[0] for m in margins]
    errors = [[m[0] - m[1] for m in margins], [m[2] - m[0] for m in margins]]
    colours = ["tab:green" if r["points"] >= r["max_points"] else "tab:red" for r in run.results]
    ax.barh(names, ratios, xerr=errors, color=colours, capsize=4)
    ax.axvline(1.0, color="black", linestyle="--", label="target")
    ax.set_xlabel("measured ÷ target (≥ 1 meets the target; error bars: 95% CI)")
    ax.invert_yaxis()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buffer.getvalue()).decode()


def _fmt(result: dict) -> str:
    ci = ""
    if result["ci_low"] is not None:
        ci = f" ({result['ci_low']:.3g}–{result['ci_high']:.3g})"
    return f"{result['value']:.3g}{ci}"


def _lab_section(run: LabRun) -> str:
    status = "ran" if run.ok else f"FAILED: {html.escape(run.error)}"
    rows = "".join(
        f"<tr><td>{html.escape(r['check'])}</td><td>{r['kind']}</td><td>{_fmt(r)}</td>"
        f"<td>{r['target']:g}</td><td>{r['floor']:g}</td><td>{r['points']:g}/{r['max_points']:g}"
        f"</td><td>{'pass' if r['points'] >= r['max_points'] else 'below target'}</td></tr>"
        for r in run.results
    )
    table = (
        "<table><tr><th>check</th><th>kind</th><th>measured (95% CI)</th><th>target</th>"
        f"<th>zero at</th><th>points</th><th>verdict</th></tr>{rows}</table>"
        if run.results
        else "<p>No graded measurements were recorded.</p>"
    )
    plot = f'<img src="data:image/png;base64,{_plot(run)}">' if run.results else ""
    return (
        f"<h2>{html.escape(run.lab)} — {html.escape(run.title)}</h2>"
        f"<p>Track <b>{run.track}</b> ({html.escape(run.track_reason)}); device {run.device}; "
        f"{status} in {run.seconds:.0f} s.</p>{table}{plot}"
    )


def write(runs: list[LabRun], folder: Path, smoke: bool) -> tuple[Path, Path]:
    """Write report.json and report.html into ``folder``; return both paths."""
    folder.mkdir(parents=True, exist_ok=True)
    machine = hardware.machine()
    json_path = folder / "report.json"
    json_path.write_text(
        json.dumps(
            {
                "smoke": smoke,
                "cpu": machine.cpu_model,
                "cuda": machine.cuda.name or None,
                "labs": [asdict(r) for r in runs],
            },
            indent=2,
        )
    )
    body = "".join(_lab_section(run) for run in runs)
    mode = "smoke sizes" if smoke else "full sizes"
    page = (
        "<!doctype html><meta charset='utf-8'><title>ptcourse report card</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>"
        f"<h1>ptcourse report card</h1><p>{html.escape(machine.cpu_model)}; "
        f"CUDA: {html.escape(machine.cuda.name or 'none')}; {mode}.</p>{body}"
    )
    html_path = folder / "report.html"
    html_path.write_text(page)
    return json_path, html_path
