"""Credentials (common/auth.py): what a verifier accepts, owner-only files, and a server
whose interceptor refuses before any request byte is parsed, on every kind of method."""

import os

import grpc
import numpy as np
import pytest

from elastic_keras.common import auth, rpc
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import AUTHORITY, PServerServicer, add_to_server

JOB = "auth-job"


def test_a_verifier_accepts_only_this_jobs_credentials_as_written():
    secret = auth.new_secret()
    verifier = auth.Verifier(secret, JOB)
    good = auth.credential(secret, JOB, auth.Identity(auth.Role.PS, 2, 1))
    assert verifier.identity(good) == auth.Identity(auth.Role.PS, 2, 1)
    text, mac = good.rsplit("/", 1)
    forged = [
        None, "", "ps/2/1", good + "0", f"ps/3/1/{mac}", f"ps/02/1/{mac}", f"ps/-2/1/{mac}",
        f"admin/2/1/{mac}",
        auth.credential(secret, "another-job", auth.Identity(auth.Role.PS, 2, 1)),
        auth.credential(auth.new_secret(), JOB, auth.Identity(auth.Role.PS, 2, 1)),
    ]
    assert [verifier.identity(t) for t in forged] == [None] * len(forged)


@pytest.fixture
def shard():
    secret = auth.new_secret()
    parameters = Parameters()
    server, port = rpc.create_server(
        [lambda s: add_to_server(PServerServicer(parameters), s)],
        auth=auth.ServerAuth(auth.Verifier(secret, JOB), AUTHORITY))
    yield secret, f"127.0.0.1:{port}", parameters
    server.stop(grace=None)


def client(address, secret=None, role="worker", index=0):
    token = secret and auth.credential(secret, JOB, auth.Identity(auth.Role(role), index))
    return PSClient([address], deadline_s=10.0, token=token)


def test_every_kind_of_method_refuses_a_caller_without_credentials(shard):
    secret, address, parameters = shard
    stranger = client(address)
    calls = {
        "unary": lambda: stranger.init_model({"w": np.zeros(2, np.float32)}, "{}"),
        "server stream": lambda: stranger.pull_dense(),
        "client stream": lambda: stranger.push_gradients(0, 1, [0], {"w": np.ones(2, np.float32)}),
    }
    for kind, call in calls.items():
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, kind
    stranger.close()
    assert parameters.version == 0 and not parameters.pull().initialized


def test_a_worker_may_not_checkpoint_a_shard_and_the_master_may(shard, tmp_path):
    secret, address, _ = shard
    worker, master = client(address, secret), client(address, secret, "master")
    with pytest.raises(grpc.RpcError) as refused:
        worker.prepare_checkpoint(1, 5.0)
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    with pytest.raises(grpc.RpcError) as not_ready:  # past the interceptor: no model yet
        master.prepare_checkpoint(1, 5.0)
    assert not_ready.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    worker.close()
    master.close()
