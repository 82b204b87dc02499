import pytest


@pytest.fixture
def job(tmp_path):
    """A scratch directory for one job: scripts, logs and markers."""
    (tmp_path / "logs").mkdir()
    return tmp_path
