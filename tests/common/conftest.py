import sys

import pytest


@pytest.fixture
def restore_sys_path():
    """Puts `sys.path` back as it was, after a test that loads model-zoo modules."""
    saved = list(sys.path)
    yield
    sys.path[:] = saved
