"""Grade the reference, a baseline copy and a blank notebook of each lab under several CPU
configurations of this one machine, and check the verdicts hold under each.

A configuration changes what the CPU offers to PyTorch: ``ATEN_CPU_CAPABILITY`` (ATen's kernel
dispatch), ``ONEDNN_MAX_CPU_ISA`` (oneDNN's, which runs bf16 matmuls and convolutions) and the
cores the grading run may use (``taskset``). Under each: the reference must score full marks
(a check that is "not gradable here" moves its points to the technique, still full), the
baseline copy 0 on every speed check, the blank notebook 0.

    python tools/grading_matrix.py                       # every configuration, every lab
    python tools/grading_matrix.py --labs 03,08 --configs avx2-machine,native

The two 1-core configurations use different cores (the first and the last), so on a 2-core
machine they can run side by side, each the other's busy neighbour:

    PTCOURSE_BUILD=build/m1 python tools/grading_matrix.py --configs native-1-core &
    PTCOURSE_BUILD=build/m2 python tools/grading_matrix.py --configs avx2-machine-1-core

Writes the table to ``build/matrix/matrix.md`` and ``matrix.json`` (``PTCOURSE_BUILD`` moves
them); exits 1 if a verdict is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CONFIGS: dict[str, dict[str, str]] = {
    "native": {},
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx2-machine": AVX2_MACHINE,
    "native-1-core": {"CORES": "first"},
    "avx2-machine-1-core": {**AVX2_MACHINE, "CORES": "last"},
}


def write_submissions(folder: Path, keys: list[str]) -> None:
    from submissions import VARIANTS

    from ptcourse.course import autograde, paths

    for the_lab in paths.course_labs(keys):
        autograde.copy_submission(paths.notebook(the_lab), folder, "reference", the_lab)
        autograde.copy_submission(paths.notebook(the_lab, "labs"), folder, "blank", the_lab)
        nb = json.loads(paths.notebook(the_lab).read_text())
        replacements = VARIANTS[the_lab.name]["students"]["baseline"]
        for cell in nb["cells"]:
            grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
            if grade_id in replacements:
                cell["source"] = replacements[grade_id]
        target = folder / "baseline" / the_lab.name / f"{the_lab.name}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(nb))


def grade(config: str, submissions: Path, build: Path, keys: list[str]) -> list[dict]:
    env = {**os.environ, **CONFIGS[config], "PTCOURSE_SMOKE": "1", "PTCOURSE_BUILD": str(build)}
    which = env.pop("CORES", None)
    command = [sys.executable, "-m", "ptcourse.course.cli", "grade", str(submissions), *keys]
    if which:
        core = sorted(os.sched_getaffinity(0))[0 if which == "first" else -1]
        command = ["taskset", "--cpu-list", str(core), *command]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{config}: grading failed\n{done.stdout}\n{done.stderr[-2000:]}")
    return json.loads((build / "grades" / "grades.json").read_text())


def verdicts(scores: list[dict]) -> dict[str, dict[str, str]]:
    """Per lab: "ok" or what went wrong, for reference, baseline and blank."""
    from submissions import VARIANTS

    found: dict[str, dict[str, str]] = {}
    by = {(s["student"], s["lab"]): s for s in scores}
    for (student, lab_name), s in by.items():
        speed = VARIANTS[lab_name]["speed_checks"]
        if student == "reference":
            wrong = {c: p for c, p in s["cells"].items() if p < _max(by, lab_name, c)}
        elif student == "baseline":
            wrong = {c: p for c, p in s["cells"].items() if c in speed and p > 0}
        else:
            wrong = {c: p for c, p in s["cells"].items() if p > 0}
        total = f"{s['auto_score']:g}/{s['auto_max']:g}"
        found.setdefault(lab_name, {})[student] = f"{total} ok" if not wrong else f"{total} {wrong}"
    return found


def _max(by: dict, lab_name: str, cell: str) -> float:
    import nbformat

    from ptcourse.core.lineup import lab
    from ptcourse.course import paths

    nb = nbformat.read(paths.notebook(lab(lab_name)), as_version=4)
    for each in nb.cells:
        meta = each.metadata.get("nbgrader", {})
        if meta.get("grade_id") == cell:
            return float(meta.get("points", 0))
    return 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labs", default="", help="comma-separated lab numbers (all written)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names")
    args = parser.parse_args()
    keys = [k for k in args.labs.split(",") if k]
    from ptcourse.course.paths import BUILD

    out = BUILD / "matrix"
    out.mkdir(parents=True, exist_ok=True)
    submissions = out / "submissions"
    shutil.rmtree(submissions, ignore_errors=True)
    write_submissions(submissions, keys)
    table, failed = {}, False
    for config in args.configs.split(","):
        started = time.monotonic()
        table[config] = verdicts(grade(config, submissions, out / f"build-{config}", keys))
        failed |= any("ok" not in v for row in table[config].values() for v in row.values())
        print(f"{config}: {time.monotonic() - started:.0f} s", flush=True)
        (out / "matrix.json").write_text(json.dumps(table, indent=2))
    lines = ["| configuration | lab | reference | baseline copy | blank |", "|---|---|---|---|---|"]
    for config, labs in table.items():
        for lab_name, row in sorted(labs.items()):
            cells = [row.get(s, "—") for s in ("reference", "baseline", "blank")]
            lines.append(f"| {config} | {lab_name} | " + " | ".join(cells) + " |")
    (out / "matrix.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
