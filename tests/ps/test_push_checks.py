"""`Parameters.push` checks a push whole before any of it applies: ids, non-finite values
(refused or skipped), and a failed apply that leaves the sequence and the round as they were.
"""

import json

import keras
import numpy as np
import pytest

from elastic_keras.common.errors import ApplyError, NonFiniteError, PayloadError
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push, TableConfig

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(1.0)))
KERNEL = np.arange(6, dtype=np.float32).reshape(3, 2)


def shard(policy=UpdatePolicy(), **limits):
    parameters = Parameters(policy, limits=PayloadLimits(**limits))
    parameters.init_model([("kernel", KERNEL)], SGD,
                          [TableConfig("user", 2, 0, "zeros"), TableConfig("item", 2, 8, "zeros")])
    return parameters


def rows(ids, values=1.0, dense_shape=(0, 2)):
    ids = np.asarray(ids)
    return Slices(np.full((len(ids), 2), values, np.float32), ids, dense_shape)


def state(parameters):
    return (parameters.version, parameters.pull().dense["kernel"].tolist(),
            parameters.pull_embeddings([("user", np.array([-3, 5]))])[0]["user"].tolist())


@pytest.mark.parametrize("gradients, problem", [
    ([("kernel", rows([0, -1]))], "row ids must be in [0, 3)"),
    ([("kernel", rows(np.array([0.0, 1.0])))], "row ids must be a 1-D integer tensor"),
    ([("user", rows(np.array([1.5])))], "ids must be a 1-D integer tensor"),
    ([("item", rows([8]))], "ids must be in [0, 8)"),
    ([("user", rows([1])), ("user", rows([2]))], "'user' twice"),
    ([("user", rows([1])), ("kernel", np.ones((3, 3), np.float32))], "shape"),
])
def test_a_bad_push_changes_nothing_and_leaves_its_sequence_free(gradients, problem):
    parameters = shard()
    before = state(parameters)
    with pytest.raises(PayloadError) as info:
        parameters.push(Push(0, 1, gradients=gradients))
    assert problem in str(info.value) and "Received:" in str(info.value)
    assert state(parameters) == before and parameters.applied_sequence(0) == 0


def test_negative_ids_of_an_unbounded_table_are_valid_ids():
    parameters = shard()
    assert parameters.push(Push(0, 1, gradients=[("user", rows([-3, 5]))])).model_version == 1
    assert state(parameters)[2] == [[-1.0, -1.0], [-1.0, -1.0]]


def test_non_finite_table_rows_are_refused_whole():
    parameters = shard()
    before = state(parameters)
    with pytest.raises(NonFiniteError, match="Gradient 'user' with 1 NaN and 0 Inf"):
        parameters.push(Push(0, 1, gradients=[("kernel", np.ones((3, 2), np.float32)),
                                              ("user", rows([5], [np.nan, 0.0]))]))
    assert state(parameters) == before and parameters.non_finite_pushes == 1


def test_a_skipped_push_counts_as_an_empty_contribution_to_its_round():
    parameters = shard(UpdatePolicy(grads_to_wait=2), non_finite_gradients="skip")
    skipped = parameters.push(Push(0, 1, gradients=[("kernel", np.full((3, 2), np.inf,
                                                                       np.float32))]))
    assert skipped.accepted and skipped.reason.startswith("skipped")
    assert parameters.pending_pushes == 1 and parameters.non_finite_pushes == 1
    assert parameters.push(Push(1, 1, gradients=[("kernel", np.ones((3, 2), np.float32))])
                           ).model_version == 1
    np.testing.assert_allclose(parameters.pull().dense["kernel"], KERNEL - 0.5)
    assert parameters.applied_pushes == {0: 1, 1: 1}


def _failing_once(monkeypatch, parameters):
    applier = parameters._model.applier
    real = applier.apply

    def fail(*args):
        monkeypatch.setattr(applier, "apply", real)
        raise ValueError("out of memory")

    monkeypatch.setattr(applier, "apply", fail)


def test_an_apply_failure_leaves_the_sequence_free(monkeypatch):
    parameters = shard()
    _failing_once(monkeypatch, parameters)
    push = Push(0, 1, gradients=[("kernel", np.ones((3, 2), np.float32))])
    with pytest.raises(ApplyError, match="ValueError: out of memory"):
        parameters.push(push)
    assert parameters.applied_sequence(0) == 0 and parameters.version == 0
    assert parameters.push(push).model_version == 1 and parameters.applied_sequence(0) == 1


def test_an_apply_failure_leaves_the_round_as_it_was(monkeypatch):
    parameters = shard(UpdatePolicy(grads_to_wait=2))
    ones = np.ones((3, 2), np.float32)
    parameters.push(Push(0, 1, gradients=[("kernel", ones)]))
    _failing_once(monkeypatch, parameters)
    with pytest.raises(ApplyError):
        parameters.push(Push(1, 1, gradients=[("kernel", ones)]))
    assert parameters.pending_pushes == 1 and parameters.applied_sequence(1) == 0
    assert parameters.push(Push(1, 1, gradients=[("kernel", 3 * ones)])).model_version == 1
    np.testing.assert_allclose(parameters.pull().dense["kernel"], KERNEL - 2.0)
