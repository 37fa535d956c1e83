import pytest

from tests.worker.shards import two_shards


@pytest.fixture
def shards():
    """Two asynchronous shards that refuse pushes staler than one version, on 127.0.0.1:
    (their `Parameters`, addresses, servers)."""
    with two_shards() as served:
        yield served
