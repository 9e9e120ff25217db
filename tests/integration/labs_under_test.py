"""``PTCOURSE_TEST_LABS=06,08 pytest tests/integration`` runs the course tiers for those labs only
(the default, every written lab, is what CI runs)."""

import os


def selected_labs() -> list[str]:
    return [key.strip() for key in os.environ.get("PTCOURSE_TEST_LABS", "").split(",") if key]
