"""Push sequences belong to a launch of a worker (ps/parameters.py, ps/servicer.py): no
push, whatever its sequence, shadows the pushes of a later launch, and a replaced launch
may push no more. Over real gRPC with the job's `ServerAuth`, whose credentials name the
launch."""

import json

import grpc
import keras
import numpy as np
import pytest

from elastic_keras.common import auth
from elastic_keras.common.errors import ReplacedLaunchError
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import DUPLICATE, Push
from tests.common.test_auth import JOB, shard  # noqa: F401 - the fixture

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(1.0)))
ONE = {"w": np.ones(2, np.float32)}


@pytest.fixture
def launches(shard):
    """`(parameters, worker)`: the shard, and `worker(launch)`, a client with worker 0's
    credential of that launch."""
    secret, address, parameters = shard
    clients = []

    def worker(launch):
        token = auth.credential(secret, JOB, auth.Identity(auth.Role.WORKER, 0, launch))
        clients.append(PSClient([address], deadline_s=10, token=token))
        return clients[-1]

    yield parameters, worker
    for client in clients:
        client.close()


def test_a_huge_sequence_shadows_no_later_launch(launches):
    """The attack: one push with sequence 2**63-1 made every later push of worker 0 a
    "duplicate". Sequences stop below 2**62, and a relaunched worker starts afresh."""
    parameters, worker = launches
    first = worker(0)
    [answer] = first.init_model({"w": np.zeros(2, np.float32)}, SGD, worker_id=0)
    with pytest.raises(grpc.RpcError) as refused:
        first.push_gradients(0, 2**63 - 1, [0], ONE)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "sequence must be in [0, 2**62). Received: sequence=9223372036854775807" in \
        refused.value.details()
    first.push_gradients(0, 2**62 - 1, [0], ONE)  # the most a launch can shadow: itself
    assert parameters.version == 1

    second = worker(1)
    [answer] = second.init_model({"w": np.zeros(2, np.float32)}, SGD, worker_id=0)
    assert answer.applied_sequence == 0  # launch 0's sequences are not launch 1's
    [result] = second.push_gradients(0, 10, [1], ONE)
    assert result.accepted and not result.reason and parameters.version == 2
    assert second.push_gradients(0, 10, [2], ONE)[0].reason == DUPLICATE  # same launch

    with pytest.raises(grpc.RpcError) as replaced:
        first.push_gradients(0, 2**62 - 1, [2], ONE)
    assert replaced.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "launch 0 has been replaced by launch 1" in replaced.value.details()
    assert parameters.version == 2 and parameters.pull().dense["w"].tolist() == [-2.0, -2.0]


def test_without_known_launches_sequences_compare_as_numbers():
    """A shard restored from a checkpoint, or one without auth: the applied sequences are
    all it knows, and a lower one is a duplicate."""
    parameters = Parameters()
    parameters.init_model([("w", np.zeros(2, np.float32))], SGD)
    parameters.push(Push(worker_id=0, sequence=50, gradients=tuple(ONE.items())))
    assert parameters.push(Push(worker_id=0, sequence=40, launch=3,
                                gradients=tuple(ONE.items()))).reason == DUPLICATE
    assert parameters.push(Push(worker_id=0, sequence=51, launch=3,
                                gradients=tuple(ONE.items()))).accepted
    with pytest.raises(ReplacedLaunchError):
        parameters.push(Push(worker_id=0, sequence=60, launch=2, gradients=tuple(ONE.items())))
    assert parameters.version == 2
