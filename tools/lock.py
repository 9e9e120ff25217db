"""Rewrite constraints.txt from the packages installed in this venv (after the suite passed).

    .venv/bin/python tools/lock.py

Every distribution except the course itself is pinned exactly. The README's install commands and
CI pass ``-c constraints.txt`` to pip, so the tested versions are the ones students get.
"""

from __future__ import annotations

import platform
import sys
from importlib import metadata

from ptcourse.core.versions import CONSTRAINTS, canonical

HEADER = """\
# The versions the course is tested with: pip install -e . -c constraints.txt
# Written by tools/lock.py from a venv in which the whole test suite passed
# (Python {python}, {machine}). ptcourse doctor compares it with what is installed.
"""


def main() -> int:
    pins = {}
    for dist in metadata.distributions():
        name = canonical(dist.metadata["Name"])
        if name not in ("ptcourse", "pip"):  # pip installs the rest; it is not pinned
            pins[name] = dist.version
    header = HEADER.format(python=platform.python_version(), machine=platform.machine())
    lines = [f"{name}=={version}" for name, version in sorted(pins.items())]
    CONSTRAINTS.write_text(header + "\n".join(lines) + "\n")
    print(f"{CONSTRAINTS}: {len(lines)} pins", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
