"""ptcourse: the helper package behind every lab of the course."""

__version__ = "0.1.0"
