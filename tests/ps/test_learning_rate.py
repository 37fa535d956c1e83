"""A shard's learning rate set while the job runs (the master's LearningRateScheduler and
ReduceLROnPlateau): updates use it, checkpoints keep it, a shard relaunched with it applies
it to the model it gets, and a schedule or a bad value is refused."""

import json

import keras
import numpy as np
import pytest

from elastic_keras.common.errors import PayloadError
from elastic_keras.proto import pserver_pb2
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push
from elastic_keras.ps.sparse_optimizers import from_keras_config

KERNEL = np.arange(6, dtype=np.float32).reshape(2, 3)
GRADIENT = np.full((2, 3), 2.0, np.float32)


def _config(optimizer):
    return json.dumps(keras.optimizers.serialize(optimizer))


def _shard(optimizer=None, **kwargs):
    parameters = Parameters(**kwargs)
    parameters.init_model([("kernel", KERNEL)], _config(optimizer or keras.optimizers.SGD(0.5)))
    return parameters


def test_a_set_rate_drives_the_next_updates_and_is_checkpointed():
    parameters = _shard()
    assert parameters.learning_rate == 0.5
    assert parameters.set_learning_rate(0.125) == 0.125
    parameters.push(Push(0, 1, gradients=[("kernel", GRADIENT)]))
    np.testing.assert_allclose(parameters.pull().dense["kernel"], KERNEL - 0.125 * GRADIENT)
    snapshot = parameters.snapshot()
    assert json.loads(snapshot.optimizer_config)["config"]["learning_rate"] == 0.125
    restored = Parameters()
    restored.restore(snapshot)
    assert restored.learning_rate == 0.125


def test_a_rate_given_before_the_model_applies_to_the_model_it_gets():
    parameters = _shard(learning_rate=0.25)  # a relaunched shard: the rate on its command line
    assert parameters.learning_rate == 0.25
    empty = Parameters()
    assert empty.set_learning_rate(0.5) is None and empty.learning_rate == 0.5
    empty.init_model([("kernel", KERNEL)], _config(keras.optimizers.Adam(0.01)))
    assert empty.learning_rate == 0.5


@pytest.mark.parametrize("rate", [float("nan"), -0.1, float("inf"), "0.1"])
def test_a_bad_rate_is_refused_and_changes_nothing(rate):
    parameters = _shard()
    with pytest.raises(PayloadError, match="finite number >= 0"):
        parameters.set_learning_rate(rate)
    assert parameters.learning_rate == 0.5


def test_a_scheduled_rate_cannot_be_set():
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5)
    parameters = _shard(keras.optimizers.SGD(schedule))
    with pytest.raises(PayloadError, match="schedule"):
        parameters.set_learning_rate(0.01)
    assert parameters.learning_rate is None


def test_the_tables_sparse_optimizer_takes_the_rate():
    sparse = from_keras_config(json.loads(_config(keras.optimizers.SGD(0.5))))
    sparse.set_learning_rate(0.1)
    assert sparse.learning_rate(1) == pytest.approx(0.1)


def test_the_rate_is_read_and_set_over_grpc(stub):
    answer = stub.LearningRate(pserver_pb2.LearningRateRequest())
    assert not answer.initialized
    assert not stub.LearningRate(pserver_pb2.LearningRateRequest(learning_rate=0.3)).initialized
    with pytest.raises(Exception) as refused:
        stub.LearningRate(pserver_pb2.LearningRateRequest(learning_rate=-1.0))
    assert refused.value.code().name == "INVALID_ARGUMENT"
