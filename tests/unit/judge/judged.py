"""Helpers the judge tests share (a module of their own: `conftest` is a name every test folder
uses, so importing from it picks whichever conftest pytest loaded last)."""

import sys
from pathlib import Path

from ptcourse.course.paths import ROOT


def readable() -> list[Path]:
    return [ROOT, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()]


def run(worker, source: str, timeout: float = 60) -> list[dict]:
    """A cell's outputs."""
    return worker.request("cell", source, 0, timeout=timeout)["outputs"]


def printed(outputs: list[dict]) -> str:
    return "".join(o.get("text", "") for o in outputs if o["output_type"] == "stream")


def error(outputs: list[dict]) -> str:
    return "".join(f"{o['ename']}: {o['evalue']}" for o in outputs if o["output_type"] == "error")
