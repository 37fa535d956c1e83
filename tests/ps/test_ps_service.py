"""The PServer service over real loopback gRPC: init, pull, push and what it rejects."""

import json
import threading

import grpc
import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.transfer import tensor_codec
from elastic_keras.proto import pserver_pb2

RNG = np.random.default_rng(7)
INITIAL = {
    "dense/kernel": RNG.standard_normal((4, 3)).astype(np.float32),
    "dense/bias": RNG.standard_normal(3).astype(np.float32),
    "embedding/embeddings": RNG.standard_normal((10, 2)).astype(np.float32),
    "bn/moving_mean": np.zeros(3, np.float32),
    "steps": np.array(0, np.int64),
}
GRADS = {
    "dense/kernel": RNG.standard_normal((4, 3)).astype(np.float32),
    "dense/bias": RNG.standard_normal(3).astype(np.float32),
}
LR = 0.1


def optimizer_config(optimizer):
    return json.dumps(keras.optimizers.serialize(optimizer))


NON_TRAINABLE = ("bn/moving_mean", "steps")


def init(stub, values=INITIAL, optimizer=None):
    return stub.InitModel(
        pserver_pb2.InitModelRequest(
            dense=[tensor_codec.encode(n, v) for n, v in values.items()],
            optimizer_config=optimizer_config(optimizer or keras.optimizers.SGD(LR)),
            variables=[pserver_pb2.VariableOptions(name=n, trainable=n not in NON_TRAINABLE)
                       for n in values],
        )
    )


def pull(stub, known_version=-1):
    """(initialized, version, {name: array}) of the shard."""
    response = stub.PullDense(pserver_pb2.PullDenseRequest(known_version=known_version))
    values = {t.name: tensor_codec.decode(t) for t in response.dense}
    return response.initialized, response.model_version, values


def push(stub, gradients=(), deltas=(), worker_id=0, sequence=1):
    """Pushes wire tensors (or `{name: value}` dicts, encoded here)."""
    def wire(tensors):
        if isinstance(tensors, dict):
            return [tensor_codec.encode(n, v) for n, v in tensors.items()]
        return list(tensors)

    return stub.PushGradients(
        pserver_pb2.PushGradientsRequest(
            worker_id=worker_id, sequence=sequence, model_version=0,
            gradients=wire(gradients), deltas=wire(deltas),
        )
    )


def keras_apply(optimizer, steps, initial=INITIAL):
    """What `optimizer` makes of `initial` after applying each `{name: gradient}` in `steps`."""
    variables = {n: tf.Variable(initial[n]) for n in steps[0]}
    optimizer.build(list(variables.values()))
    for gradients in steps:
        optimizer.apply([tf.constant(g) for g in gradients.values()],
                        [variables[n] for n in gradients])
    return {n: v.numpy() for n, v in variables.items()}


def assert_values_equal(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


# --- InitModel --------------------------------------------------------------------------


def test_first_init_initialises_at_version_zero(stub):
    response = init(stub)
    assert response.initialized_now and response.model_version == 0
    initialized, version, values = pull(stub)
    assert initialized and version == 0
    assert_values_equal(values, INITIAL)
    assert values["steps"].dtype == np.int64


def test_second_init_keeps_the_existing_model(stub):
    init(stub)
    push(stub, GRADS)
    other = {n: np.ones_like(v) for n, v in INITIAL.items()}
    response = init(stub, other)
    assert not response.initialized_now and response.model_version == 1
    _, _, values = pull(stub)
    np.testing.assert_array_equal(values["embedding/embeddings"], INITIAL["embedding/embeddings"])


def test_concurrent_inits_exactly_one_wins(stub):
    threads_count = 8
    barrier = threading.Barrier(threads_count)
    results = [None] * threads_count

    def race(i):
        values = {n: np.full_like(v, i) for n, v in INITIAL.items()}
        barrier.wait()
        results[i] = init(stub, values).initialized_now

    threads = [threading.Thread(target=race, args=(i,)) for i in range(threads_count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results.count(True) == 1
    winner = results.index(True)
    _, _, values = pull(stub)
    assert_values_equal(values, {n: np.full_like(v, winner) for n, v in INITIAL.items()})


@pytest.mark.parametrize(
    "config, problem",
    [
        ("", "not valid JSON"),
        ("{", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (json.dumps({"class_name": "NoSuchOptimizer", "config": {}}), "not a Keras optimizer"),
        (json.dumps({"class_name": "Adam", "config": {"learning_rate": "fast"}}), "learning_rate"),
        (json.dumps({"class_name": "SGD", "config": {"no_such_arg": 1}}), "no_such_arg"),
    ],
)
def test_bad_optimizer_config_is_invalid_argument_and_leaves_shard_empty(stub, config, problem):
    request = pserver_pb2.InitModelRequest(
        dense=[tensor_codec.encode("w", np.zeros(2, np.float32))], optimizer_config=config
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.InitModel(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "optimizer_config" in info.value.details() and problem in info.value.details()
    assert "Received:" in info.value.details()
    assert pull(stub)[0] is False
    assert init(stub).initialized_now


@pytest.mark.parametrize(
    "tensors, problem",
    [
        ([tensor_codec.encode("w", np.zeros(2, np.float32))] * 2, "once"),
        ([tensor_codec.encode("", np.zeros(2, np.float32))], "needs a name"),
        ([tensor_codec.encode_slices("w", np.zeros((1, 2), np.float32), [0], (3, 2))], "dense"),
    ],
)
def test_bad_init_tensors_are_invalid_argument(stub, tensors, problem):
    request = pserver_pb2.InitModelRequest(
        dense=tensors, optimizer_config=optimizer_config(keras.optimizers.SGD())
    )
    with pytest.raises(grpc.RpcError) as info:
        stub.InitModel(request)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in info.value.details()
    assert pull(stub)[0] is False


# --- PullDense --------------------------------------------------------------------------


def test_pull_before_init_is_empty_not_an_error(stub):
    assert pull(stub) == (False, 0, {})


def test_pull_sends_tensors_only_when_the_version_changed(stub):
    init(stub)
    assert pull(stub, known_version=0) == (True, 0, {})
    assert len(pull(stub, known_version=-1)[2]) == len(INITIAL)
    push(stub, GRADS)
    initialized, version, values = pull(stub, known_version=0)
    assert initialized and version == 1 and len(values) == len(INITIAL)
    assert pull(stub, known_version=1) == (True, 1, {})


# --- PushGradients ----------------------------------------------------------------------


def test_sgd_push_matches_hand_computed_update(stub):
    init(stub)
    response = push(stub, GRADS)
    assert response.accepted and response.model_version == 1 and response.reason == ""
    _, version, values = pull(stub)
    assert version == 1
    for name, gradient in GRADS.items():
        np.testing.assert_allclose(
            values[name], INITIAL[name] - np.float32(LR) * gradient, rtol=1e-6, atol=1e-7
        )
    np.testing.assert_array_equal(values["embedding/embeddings"], INITIAL["embedding/embeddings"])


def test_adam_pushes_match_a_local_keras_adam(stub):
    init(stub, optimizer=keras.optimizers.Adam(learning_rate=0.01))
    second = {n: g * -0.5 + 0.25 for n, g in GRADS.items()}
    push(stub, GRADS, sequence=1)
    push(stub, second, sequence=2)
    expected = keras_apply(keras.optimizers.Adam(learning_rate=0.01), [GRADS, second])
    _, version, values = pull(stub)
    assert version == 2
    for name in GRADS:
        np.testing.assert_allclose(values[name], expected[name], atol=1e-6)


def test_sparse_push_changes_only_touched_rows(stub):
    init(stub)
    rows = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], np.float32)
    gradient = tensor_codec.encode_slices("embedding/embeddings", rows, [1, 4, 1], (10, 2))
    assert push(stub, [gradient]).model_version == 1
    _, _, values = pull(stub)
    table, before = values["embedding/embeddings"], INITIAL["embedding/embeddings"]
    expected = before.copy()
    expected[1] -= np.float32(LR) * (rows[0] + rows[2])
    expected[4] -= np.float32(LR) * rows[1]
    np.testing.assert_allclose(table, expected, rtol=1e-6)
    untouched = [i for i in range(10) if i not in (1, 4)]
    np.testing.assert_array_equal(table[untouched], before[untouched])


def test_deltas_of_non_trainable_values_add_up_across_workers(stub):
    init(stub)
    first = {"bn/moving_mean": np.array([1, 2, 3], np.float32), "steps": np.array(5, np.int64)}
    second = {"bn/moving_mean": np.array([4, 5, 6], np.float64), "steps": np.array(2, np.int64)}
    push(stub, deltas=first, worker_id=0, sequence=1)
    assert push(stub, deltas=second, worker_id=1, sequence=1).model_version == 2
    _, _, values = pull(stub)
    np.testing.assert_array_equal(values["bn/moving_mean"], [5, 7, 9])
    assert values["bn/moving_mean"].dtype == np.float32
    assert values["steps"] == 7
    np.testing.assert_array_equal(values["dense/kernel"], INITIAL["dense/kernel"])


def test_duplicate_sequence_is_acknowledged_and_not_applied_again(stub):
    init(stub)
    push(stub, GRADS, worker_id=3, sequence=7)
    _, _, once = pull(stub)
    for sequence in (7, 6):
        response = push(stub, GRADS, worker_id=3, sequence=sequence)
        assert response.accepted and response.reason == "duplicate"
        assert response.model_version == 1
    assert_values_equal(pull(stub)[2], once)
    assert push(stub, GRADS, worker_id=4, sequence=7).model_version == 2
    assert push(stub, GRADS, worker_id=3, sequence=8).model_version == 3


def test_push_before_init_is_failed_precondition(stub):
    with pytest.raises(grpc.RpcError) as info:
        push(stub, GRADS)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "InitModel" in info.value.details()
    assert pull(stub) == (False, 0, {})


def _truncated(name, value):
    wire = tensor_codec.encode(name, value)
    wire.content = wire.content[:-4]
    return wire


KERNEL = GRADS["dense/kernel"]
BIAS = tensor_codec.encode("dense/bias", GRADS["dense/bias"])
BAD_PUSHES = {
    "unknown name": (
        dict(gradients=[tensor_codec.encode("no/such/var", KERNEL)]), "no/such/var"),
    "wrong shape": (
        dict(gradients=[tensor_codec.encode("dense/kernel", KERNEL.T)]), "shape"),
    "content size mismatch": (
        dict(gradients=[_truncated("dense/kernel", KERNEL)]), "bytes"),
    "sparse id out of range": (
        dict(gradients=[tensor_codec.encode_slices(
            "embedding/embeddings", np.ones((2, 2), np.float32), [3, 10], (10, 2))]), "10"),
    "sparse id out of range, unbounded dense_shape": (
        dict(gradients=[tensor_codec.encode_slices(
            "embedding/embeddings", np.ones((2, 2), np.float32), [3, 10], (0, 2))]),
        "must be in [0, 10)"),
    "sparse row shape": (
        dict(gradients=[tensor_codec.encode_slices(
            "embedding/embeddings", np.ones((1, 3), np.float32), [3], (10, 3))]), "row shape"),
    "good and bad gradient": (
        dict(gradients=[BIAS, tensor_codec.encode("dense/kernel", np.ones((2, 2), np.float32))]),
        "shape"),
    "repeated name": (dict(gradients=[BIAS, BIAS]), "once"),
    "gradient for an integer variable": (
        dict(gradients=[BIAS, tensor_codec.encode("steps", np.array(1, np.int64))]),
        "trainable"),
    "gradient for a non-trainable variable": (
        dict(gradients=[BIAS, tensor_codec.encode("bn/moving_mean", np.ones(3, np.float32))]),
        "trainable"),
    "good gradient, bad delta": (
        dict(gradients=[BIAS],
             deltas=[tensor_codec.encode("bn/moving_mean", np.ones(4, np.float32))]),
        "shape"),
    "delta not castable": (
        dict(gradients=[BIAS], deltas=[tensor_codec.encode("steps", np.array(1.5, np.float32))]),
        "castable"),
    "delta of a trainable variable": (
        dict(gradients=[BIAS], deltas=[tensor_codec.encode("dense/bias", np.ones(3, np.float32))]),
        "non-trainable"),
}


@pytest.mark.parametrize("case", sorted(BAD_PUSHES))
def test_bad_push_is_invalid_argument_and_changes_nothing(stub, case):
    payload, problem = BAD_PUSHES[case]
    init(stub, optimizer=keras.optimizers.Adam(learning_rate=0.01))
    before = pull(stub)
    with pytest.raises(grpc.RpcError) as info:
        push(stub, worker_id=2, sequence=5, **payload)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert problem in info.value.details() and "Received:" in info.value.details()
    assert_values_equal(pull(stub)[2], before[2])
    assert pull(stub)[1] == 0
    # The same sequence is still free, and Adam's slots and step count are untouched: a good
    # push now gives exactly a fresh Adam's first step.
    response = push(stub, GRADS, worker_id=2, sequence=5)
    assert response.reason == "" and response.model_version == 1
    expected = keras_apply(keras.optimizers.Adam(learning_rate=0.01), [GRADS])
    _, _, values = pull(stub)
    for name in GRADS:
        np.testing.assert_allclose(values[name], expected[name], atol=1e-6)
