import shutil

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "workshop: a real JupyterHub with nbgrader's exchange, release to feedback"
    )


@pytest.fixture(scope="session")
def hub_tools() -> None:
    """Skip (never fail) where the hub's executables are missing."""
    missing = [t for t in ("configurable-http-proxy",) if shutil.which(t) is None]
    try:
        import jupyterhub  # noqa: F401
    except ImportError:
        missing.append("jupyterhub (pip)")
    if missing:
        pytest.skip(f"the workshop tier needs {', '.join(missing)}")
