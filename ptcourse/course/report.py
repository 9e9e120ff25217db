"""The report card of a run: JSON for machines, one HTML page with plots for people."""

from __future__ import annotations

import base64
import html
import io
import json
from dataclasses import asdict
from pathlib import Path

import torch

from ptcourse.core import hardware, measure
from ptcourse.core.lineup import lab
from ptcourse.course.execute import LabRun
from ptcourse.grading.targets import LOWER_IS_BETTER


def _position(result: dict, x: float) -> float:
    """Where ``x`` lies between zero credit (0) and the target (1), better always to the right."""
    target, floor = result["target"], result["floor"]
    span = (target - floor) or 1e-12
    return (x - floor) / span  # a lower-is-better row has target < floor: the sign flips itself


SHOWN = (-0.5, 3.0)  # positions drawn; a value past either end is drawn at the end, labelled


def _plot(run: LabRun) -> str:
    """A PNG (base64): each check's measured value placed between zero credit and the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1.0 + 0.5 * len(run.results)))
    for row, r in enumerate(run.results):
        low = r["value"] if r["ci_low"] is None else r["ci_low"]
        high = r["value"] if r["ci_high"] is None else r["ci_high"]
        at, ends = _position(r, r["value"]), sorted((_position(r, low), _position(r, high)))
        shown = min(max(at, SHOWN[0]), SHOWN[1])
        colour = "tab:green" if r["points"] >= r["max_points"] else "tab:red"
        ax.barh(row, shown - SHOWN[0], left=SHOWN[0], color=colour, alpha=0.35)
        ax.errorbar(shown, row, xerr=[[max(shown - max(ends[0], SHOWN[0]), 0)],
                                      [max(min(ends[1], SHOWN[1]) - shown, 0)]],
                    fmt="o", color=colour, capsize=4)  # fmt: skip
        relation = "≥" if r["kind"] not in LOWER_IS_BETTER else "≤"
        ax.annotate(f"{r['value']:.3g} (target {relation} {r['target']:.3g})", (shown, row),
                    xytext=(6, 6), textcoords="offset points", fontsize=8)  # fmt: skip
    ax.axvline(0.0, color="tab:red", linestyle=":", label="zero credit")
    ax.axvline(1.0, color="black", linestyle="--", label="target (full credit)")
    ax.set_yticks(range(len(run.results)), [r["check"] for r in run.results])
    ax.set_xlim(*SHOWN)
    ax.set_xlabel("measured, from zero credit (0) to the target (1); right is better; 95% CI")
    ax.invert_yaxis()
    ax.legend(loc="lower left", bbox_to_anchor=(0, 1), ncol=2, fontsize=8, frameon=False)
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


def _share_of_peak(run: LabRun, ceilings: measure.Ceilings | None) -> str:
    """The lab's roofline points against the ceilings measured for this report: what bounds each
    here (left or right of the ridge) and what share of that bound it attained."""
    if not run.attained or ceilings is None:
        return ""
    ridge = ceilings.fp32_flops / ceilings.copy_bytes_per_s
    rows, above = [], False
    for p in run.attained:
        compute = p["intensity"] >= ridge
        roof = ceilings.fp32_flops if compute else ceilings.copy_bytes_per_s * p["intensity"]
        bound = "compute (fp32 matmul peak)" if compute else "memory (copy bandwidth)"
        above |= p["flops_per_s"] > roof
        rows.append(
            f"<tr><td>{html.escape(p['workload'])}</td><td>{p['intensity']:.3g}</td>"
            f"<td>{p['flops_per_s'] / 1e9:.3g}</td><td>{bound}</td>"
            f"<td>{p['flops_per_s'] / roof:.0%}</td></tr>"
        )
    note = (
        "<p>A share above 100%: the lab's own run measured more than this report's ceiling run "
        "(the ceilings are measured once, after the labs, under whatever else ran then).</p>"
        if above
        else ""
    )
    return (
        f"<p>Its roofline points against this report's ceilings (ridge {ridge:.3g} FLOP/byte):</p>"
        "<table><tr><th>workload</th><th>FLOP/byte</th><th>GFLOP/s</th><th>bound here</th>"
        f"<th>share of that bound</th></tr>{''.join(rows)}</table>{note}"
    )


def _lab_section(run: LabRun, ceilings: measure.Ceilings | None = None) -> str:
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
    claim = lab(run.lab).claim
    quoted = (
        f"<p class='claim'>The lab tests a published claim: <q>{html.escape(claim)}</q>. "
        f"Measured here: {html.escape(_measured(run)) or 'nothing graded'}.</p>"
        if claim
        else ""
    )
    return (
        f"<h2>{html.escape(run.lab)} — {html.escape(run.title)}</h2>"
        f"<p>Track <b>{run.track}</b> ({html.escape(run.track_reason)}); device {run.device}; "
        f"{status} in {run.seconds:.0f} s.</p>{quoted}{table}{plot}"
        f"{_share_of_peak(run, ceilings)}"
    )


def _measured(run: LabRun) -> str:
    return "; ".join(f"{r['check']} {_fmt(r)}" for r in run.results)


def _machine_section(machine: hardware.Machine, ceilings: measure.Ceilings | None) -> str:
    flags = ", ".join(machine.cpu_flags) or "none of the flags the labs use"
    lines = [
        f"CPU: {machine.cpu_model} ({flags}; kernels {machine.cpu_capability}); "
        f"CUDA: {machine.cuda.name or 'none'}; torch {torch.__version__}",
    ]
    if ceilings is not None:
        lines.append(f"Ceilings measured for this report (one thread): {ceilings.summary()}")
    return "".join(f"<p>{html.escape(line)}</p>" for line in lines)


def write(
    runs: list[LabRun], folder: Path, smoke: bool, ceilings: measure.Ceilings | None = None
) -> tuple[Path, Path]:
    """Write report.json and report.html into ``folder``; return both paths. ``ceilings`` (this
    machine's measured compute and memory peaks) head the page where given."""
    folder.mkdir(parents=True, exist_ok=True)
    machine = hardware.machine()
    json_path = folder / "report.json"
    json_path.write_text(
        json.dumps(
            {
                "smoke": smoke,
                "cpu": machine.cpu_model,
                "cuda": machine.cuda.name or None,
                "cpu_flags": list(machine.cpu_flags),
                "torch": torch.__version__,
                "ceilings": asdict(ceilings) if ceilings else None,
                "labs": [asdict(r) for r in runs],
            },
            indent=2,
        )
    )
    body = "".join(_lab_section(run, ceilings) for run in runs)
    mode = "smoke sizes" if smoke else "full sizes"
    page = (
        "<!doctype html><meta charset='utf-8'><title>ptcourse report card</title>"
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}"
        "table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}</style>"
        f"<h1>ptcourse report card</h1><p>Every lab run at {mode}.</p>"
        f"{_machine_section(machine, ceilings)}{body}"
    )
    html_path = folder / "report.html"
    html_path.write_text(page)
    return json_path, html_path
