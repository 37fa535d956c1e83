"""Fixtures for the parameter-server tests: a real shard served on 127.0.0.1."""

import pytest

from elastic_keras.common import rpc
from elastic_keras.common.transfer import tensor_stream
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server


@pytest.fixture
def stub():
    """A `PServerStub` talking over loopback gRPC to a fresh, uninitialised shard."""
    servicer = PServerServicer(Parameters())
    server, port = rpc.create_server(
        [lambda s: add_to_server(servicer, s)]
    )
    channel = rpc.create_channel(f"127.0.0.1:{port}", "elastic_keras.PServer", deadline_s=30)
    yield rpc.Stub(channel, tensor_stream.PSERVER)
    channel.close()
    server.stop(0)
