"""Fixtures for the parameter-server tests: a real shard served on 127.0.0.1."""

import pytest

from elastic_keras.common import rpc
from elastic_keras.proto import pserver_pb2_grpc
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer


@pytest.fixture
def stub():
    """A `PServerStub` talking over loopback gRPC to a fresh, uninitialised shard."""
    servicer = PServerServicer(Parameters())
    server, port = rpc.create_server(
        [lambda s: pserver_pb2_grpc.add_PServerServicer_to_server(servicer, s)]
    )
    channel = rpc.create_channel(f"127.0.0.1:{port}", "elastic_keras.PServer", deadline_s=30)
    yield pserver_pb2_grpc.PServerStub(channel)
    channel.close()
    server.stop(0)
