"""A workshop's JupyterHub: two students and an instructor on one machine, nbgrader's exchange.

Start it from this folder: ``jupyterhub -f deploy/jupyterhub_config.py`` (see docs/workshop.md).
Every setting a test or a second hub must move is an environment variable:
PTCOURSE_HUB_PORT (8000), PTCOURSE_HUB_API_PORT (8081), PTCOURSE_PROXY_API_PORT (8001),
PTCOURSE_HUB_STATE (where the hub keeps its database, cookie secret and the users' homes),
PTCOURSE_HUB_PASSWORD (the shared workshop password), PTCOURSE_HUB_USERS (students, comma
separated), PTCOURSE_HUB_INSTRUCTOR, PTCOURSE_HUB_SERVICE_TOKEN (an admin service's token, for
scripts that drive the hub's REST API).
"""

import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 — provided by JupyterHub's config loader

env = os.environ.get
state = Path(env("PTCOURSE_HUB_STATE", "/srv/ptcourse-hub")).resolve()
state.mkdir(parents=True, exist_ok=True)
students = [s for s in env("PTCOURSE_HUB_USERS", "student1,student2").split(",") if s]
instructor = env("PTCOURSE_HUB_INSTRUCTOR", "instructor")

c.JupyterHub.bind_url = f"http://127.0.0.1:{env('PTCOURSE_HUB_PORT', '8000')}"
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{env('PTCOURSE_HUB_API_PORT', '8081')}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{env('PTCOURSE_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.pid_file = str(state / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(state / "jupyterhub.pid")
c.JupyterHub.cleanup_servers = True

# A shared password and named accounts, no system users: a workshop machine, not a campus.
# For a real class put an OAuth or LDAP authenticator here; the rest stays the same.
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = env("PTCOURSE_HUB_PASSWORD", "change-me")
c.Authenticator.allowed_users = {*students, instructor}
c.Authenticator.admin_users = {instructor}

# Each user's server is a process of the hub's own user, HOME in its own folder: no system
# accounts are needed (students trust each other's code as much as the machine's owner does).
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = str(state / "home" / "{username}")
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 60
c.Spawner.start_timeout = 60
# The nbgrader exchange and course, from deploy/nbgrader_config.py, for everyone's server.
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": str(Path(__file__).resolve().parent),
    "PTCOURSE_EXCHANGE": env("PTCOURSE_EXCHANGE", str(state / "exchange")),
    "PTCOURSE_SMOKE": env("PTCOURSE_SMOKE", "0"),
    # Every server runs as the hub's one system user: nbgrader would submit as that user, so
    # each student's server names its student (deploy/nbgrader_config.py reads it).
    "PTCOURSE_STUDENT": lambda spawner: (
        "" if spawner.user.name == instructor else spawner.user.name
    ),
}
if os.geteuid() == 0:  # a container running as root: Jupyter Server asks for this
    c.Spawner.args = ["--ServerApp.allow_root=True"]

token = env("PTCOURSE_HUB_SERVICE_TOKEN")
if token:
    c.JupyterHub.services = [{"name": "workshop-driver", "api_token": token}]
    c.JupyterHub.load_roles = [
        {
            "name": "workshop-driver",
            "scopes": ["admin:users", "admin:servers", "access:servers", "read:users"],
            "services": ["workshop-driver"],
        }
    ]
