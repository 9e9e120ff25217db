"""nbgrader's exchange for a workshop: everyone's server (JUPYTER_CONFIG_PATH=deploy/) and the
instructor's commands read this; the course folders come from the repository's own
nbgrader_config.py (run instructor commands from the repository's root)."""

import os

c = get_config()  # noqa: F821 — provided by nbgrader's config loader

c.CourseDirectory.course_id = os.environ.get("PTCOURSE_COURSE_ID", "ptcourse")
# One folder every user can write: nbgrader's exchange (release, inbound, feedback).
c.Exchange.root = os.environ.get("PTCOURSE_EXCHANGE", "/srv/nbgrader/exchange")
os.makedirs(c.Exchange.root, exist_ok=True)
# Timing checks run inside test cells: nbgrader's default of 30 s per cell is far too short
# (the repository's nbgrader_config.py sets the same for the instructor's autograde).
c.Execute.timeout = int(os.environ.get("PTCOURSE_CELL_TIMEOUT", "300"))
# On a hub whose servers all run as one system user, each student's server names its student
# (deploy/jupyterhub_config.py sets PTCOURSE_STUDENT): submissions and feedback go by that name.
if os.environ.get("PTCOURSE_STUDENT"):
    c.CourseDirectory.student_id = os.environ["PTCOURSE_STUDENT"]
