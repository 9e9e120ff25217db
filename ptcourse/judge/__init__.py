"""The judge: grading from outside the student's process (see judge.py)."""

import sys

# jsonschema (imported by nbformat) builds ~35 IRI parsers when rfc3987-syntax is installed:
# 1.4 s of every judge's start-up, for a format no notebook schema uses (jsonschema issue
# #1428). Without the module it skips that format, as it does where the module is absent.
sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[arg-type]
