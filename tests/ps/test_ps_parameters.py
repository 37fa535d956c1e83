"""`Parameters` and `OptimizerApplier` without gRPC: snapshots, sparse rows, compiled apply."""

import json

import keras
import ml_dtypes
import numpy as np
import pytest

from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps import optimizer as optimizer_module
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push

RNG = np.random.default_rng(11)
TABLE = RNG.standard_normal((20, 4)).astype(np.float32)
KERNEL = RNG.standard_normal((4, 3)).astype(np.float32)


def sgd(learning_rate):
    return json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(learning_rate)))


def adam():
    return json.dumps(keras.optimizers.serialize(keras.optimizers.Adam(learning_rate=0.01)))


def shard(config=None):
    parameters = Parameters()
    parameters.init_model([("table", TABLE), ("kernel", KERNEL)], config or adam())
    return parameters


def rows(ids, width=4, seed=0):
    values = np.random.default_rng(seed).standard_normal((len(ids), width)).astype(np.float32)
    return Slices(values, np.asarray(ids, np.int64), (20, width))


def test_pulled_arrays_are_snapshots_unchanged_by_later_pushes():
    parameters = shard()
    before = parameters.pull().dense
    copies = {n: v.copy() for n, v in before.items()}
    parameters.push(Push(0, 1, gradients=[("table", rows([2, 5])), ("kernel", KERNEL)]))
    parameters.push(Push(0, 2, gradients=[("table", rows([2, 7], seed=1))]))
    for name in copies:
        np.testing.assert_array_equal(before[name], copies[name])
    assert not np.array_equal(parameters.pull().dense["table"][2], copies["table"][2])


def test_repeated_sparse_ids_count_as_their_sum():
    repeated = rows([3, 3, 9])
    summed = Slices(
        np.stack([repeated.values[0] + repeated.values[1], repeated.values[2]]),
        np.array([3, 9], np.int64), (20, 4),
    )
    with_repeats, with_sum = shard(), shard()
    with_repeats.push(Push(0, 1, gradients=[("table", repeated)]))
    with_sum.push(Push(0, 1, gradients=[("table", summed)]))
    np.testing.assert_allclose(
        with_repeats.pull().dense["table"], with_sum.pull().dense["table"], atol=1e-7
    )


def test_compiled_apply_equals_eager_apply_and_traces_once(monkeypatch):
    pushes = [
        Push(0, step, gradients=[("table", rows(ids, seed=step)),
                                 ("kernel", KERNEL * step)])
        for step, ids in enumerate([[1, 2], [4], [1, 5, 6, 19]], start=1)
    ]
    compiled = shard()
    for push in pushes:
        compiled.push(push)
    monkeypatch.setattr(optimizer_module, "MAX_COMPILED_SIGNATURES", 0)
    eager = shard()
    for push in pushes:
        eager.push(push)
    for name, value in eager.pull().dense.items():
        np.testing.assert_allclose(compiled.pull().dense[name], value, atol=1e-6)
    # One graph for the pushes' signature (table rows, kernel dense), one warmed up for a
    # push of both dense; none past the cap.
    assert compiled._model.applier.traces == 2
    assert eager._model.applier.traces == 0


def test_the_update_of_a_dense_push_is_traced_before_it_comes(monkeypatch):
    warm = shard()
    assert warm._model.applier.traces == 1  # the warm-up, waited for
    push = Push(0, 1, gradients=[("table", RNG.standard_normal((20, 4)).astype(np.float32)),
                                 ("kernel", KERNEL)])
    warm.push(push)
    assert warm._model.applier.traces == 1  # that graph applied it
    monkeypatch.setattr(optimizer_module, "MAX_COMPILED_SIGNATURES", 0)
    eager = shard()
    eager.push(push)
    assert eager._model.applier.traces == 0
    for name, value in eager.pull().dense.items():
        np.testing.assert_allclose(warm.pull().dense[name], value, atol=1e-6)


def test_a_push_during_the_warm_up_is_traced_once():
    parameters = shard()  # the warm-up has just started, on its own thread
    parameters.push(Push(0, 1, gradients=[("table", TABLE), ("kernel", KERNEL)]))
    assert parameters._model.applier.traces == 1


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float64])
def test_gradients_of_other_float_dtypes_are_cast(dtype):
    sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(learning_rate=1.0)))
    parameters = shard(sgd)
    parameters.push(Push(0, 1, gradients=[("kernel", np.ones((4, 3), dtype))]))
    np.testing.assert_allclose(parameters.pull().dense["kernel"], KERNEL - 1, rtol=1e-6)


def test_an_empty_push_is_acknowledged_without_a_version_when_asynchronous():
    parameters = shard()
    result = parameters.push(Push(0, 1))
    assert (result.accepted, result.model_version, result.reason) == (True, 0, "")
    np.testing.assert_array_equal(parameters.pull().dense["kernel"], KERNEL)
    # Its sequence is used (a resend is a duplicate) and it counts as the worker's push.
    assert parameters.push(Push(0, 1)).reason == "duplicate"
    assert parameters.applied_sequence(0) == 1 and parameters.applied_pushes == {0: 1}
    assert parameters.push(Push(0, 2, gradients=[("kernel", KERNEL)])).model_version == 1


def test_an_empty_push_counts_in_its_synchronous_round():
    parameters = Parameters(UpdatePolicy(grads_to_wait=2))
    parameters.init_model([("kernel", KERNEL)], sgd(1.0))
    assert parameters.push(Push(0, 1)).model_version == 0
    assert parameters.pending_pushes == 1
    # The round closes with two pushes, the empty one a zero: the gradient is halved.
    assert parameters.push(Push(1, 1, gradients=[("kernel", np.ones_like(KERNEL))])
                           ).model_version == 1
    np.testing.assert_allclose(parameters.pull().dense["kernel"], KERNEL - 0.5)


def test_a_shard_may_hold_no_variables():
    parameters = Parameters()
    assert parameters.init_model([], adam()).initialized_now
    assert parameters.push(Push(0, 1)).accepted
    assert parameters.pull().dense == {}
