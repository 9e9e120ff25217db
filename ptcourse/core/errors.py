"""Bad input to the course's commands, said in one line.

An unknown lab, a missing folder or an unknown dataset is not a bug: ``ptcourse`` prints the
error's message as one line (``ptcourse: error: …``) and exits 2, with no traceback. The
message says what is wrong and what to do instead.
"""

from __future__ import annotations


class CourseInputError(Exception):
    """Bad input from whoever runs a course command; its message is one line for them."""

    def __str__(self) -> str:  # a KeyError subclass would otherwise print its message quoted
        return str(self.args[0]) if self.args else ""
