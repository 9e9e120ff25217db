"""Capture everything written to stderr (Python and C level) and every warning.

nbgrader scores an autograder test cell 0 if *anything* appears on stderr, so grading checks
and backend probes run inside :func:`captured_stderr` and report what they caught on stdout.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field


@dataclass
class Captured:
    """What a block wrote to stderr and which warnings it raised."""

    text: str = ""
    warnings: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text.strip() or self.warnings)

    def summary(self, limit: int = 600) -> str:
        parts = [f"warning: {w}" for w in self.warnings]
        if self.text.strip():
            parts.append(self.text.strip())
        joined = "\n".join(parts)
        return joined if len(joined) <= limit else joined[:limit] + " …"


@contextlib.contextmanager
def captured_stderr() -> Iterator[Captured]:
    """Redirect ``sys.stderr`` and file descriptor 2 into a buffer; record warnings."""
    result = Captured()
    py_buffer = io.StringIO()
    sys.stderr.flush()
    saved_fd = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as fd_buffer:
        os.dup2(fd_buffer.fileno(), 2)
        try:
            with (
                warnings.catch_warnings(record=True) as caught,
                contextlib.redirect_stderr(py_buffer),
            ):
                warnings.simplefilter("always")
                yield result
        finally:
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            fd_buffer.seek(0)
            fd_text = fd_buffer.read().decode(errors="replace")
            result.text = py_buffer.getvalue() + fd_text
            result.warnings = [f"{w.category.__name__}: {w.message}" for w in caught]
