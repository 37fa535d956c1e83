"""Synchronous rounds and asynchronous staleness rules of one shard (`ps.consistency`)."""

import json
import time

import keras
import numpy as np
import pytest

from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push, TableConfig

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.1)))


def shard(**policy):
    params = Parameters(UpdatePolicy(**policy))
    params.init_model([("w", np.zeros(2, np.float32))], SGD,
                      [TableConfig("t", 2, initializer="zeros")])
    return params


def push(params, worker, seq, version, grad, rows=None):
    gradients = [("w", np.asarray(grad, np.float32))]
    if rows is not None:
        ids, values = rows
        gradients.append(("t", Slices(np.asarray(values, np.float32),
                                      np.asarray(ids, np.int64), (0, 2))))
    return params.push(Push(worker, seq, version, tuple(gradients)))


def w(params):
    return params.pull().dense["w"]


def test_sync_round_averages_k_pushes_and_applies_once():
    params = shard(grads_to_wait=2)
    first = push(params, 0, 1, 0, [1.0, 2.0], ([5], [[1.0, 1.0]]))
    assert first.accepted and first.model_version == 0
    np.testing.assert_array_equal(w(params), [0, 0])  # nothing applied yet
    second = push(params, 1, 1, 0, [3.0, 4.0], ([5, 6], [[3.0, 3.0], [2.0, 2.0]]))
    assert second.model_version == 1
    np.testing.assert_allclose(w(params), [-0.2, -0.3])  # -0.1 * mean
    rows, _ = params.pull_embeddings([("t", np.array([5, 6]))])
    # Row 5: mean of 1 and 3; row 6: 2 and a zero row from the push that lacked it.
    np.testing.assert_allclose(rows["t"], [[-0.2, -0.2], [-0.1, -0.1]])


def test_sync_rejects_a_push_against_an_old_version():
    params = shard(grads_to_wait=1)
    push(params, 0, 1, 0, [1, 1])
    stale = push(params, 1, 1, 0, [1, 1])
    assert not stale.accepted and stale.stale and "version 0" in stale.reason
    np.testing.assert_allclose(w(params), [-0.1, -0.1])
    assert params.staleness.rejections == 1
    assert push(params, 1, 2, 1, [1, 1]).accepted  # recomputed against version 1


def test_retried_push_joins_a_round_once():
    params = shard(grads_to_wait=2)
    push(params, 0, 7, 0, [1, 1])
    assert push(params, 0, 7, 0, [1, 1]).reason == "duplicate"
    assert params.pending_pushes == 1 and params.version == 0


def test_round_closes_on_timeout_with_the_pushes_it_has():
    params = shard(grads_to_wait=3, round_timeout_s=0.05)
    push(params, 0, 1, 0, [2, 2])
    assert params.close_expired_round() == 0
    time.sleep(0.06)
    assert params.close_expired_round() == 1
    np.testing.assert_allclose(w(params), [-0.2, -0.2])  # averaged over the one push
    assert params.version == 1


def test_smaller_round_size_when_fewer_workers_have_work():
    params = shard(grads_to_wait=2)
    push(params, 0, 1, 0, [1, 1])
    params.set_round_size(1)  # the other worker has no task left
    assert params.version == 1
    push(params, 0, 2, 1, [1, 1])
    assert params.version == 2
    params.set_round_size(2)  # two workers have work again
    push(params, 0, 3, 2, [1, 1])
    assert params.version == 2 and params.pending_pushes == 1
    assert params.round_size == 2


def test_pull_waits_for_the_round():
    params = shard(grads_to_wait=2)
    push(params, 0, 1, 0, [1, 1])
    started = time.monotonic()
    result = params.pull(known_version=0, min_version=1, timeout_s=0.2)
    assert result.model_version == 0 and time.monotonic() - started >= 0.2


def test_async_applies_at_once_and_counts_staleness():
    params = shard()
    for seq in range(3):
        assert push(params, 0, seq + 1, seq, [1, 0]).model_version == seq + 1
    push(params, 1, 1, 1, [1, 0])  # computed against version 1, applied at 3: staleness 2
    assert params.staleness.counts[:3] == [3, 0, 1]
    np.testing.assert_allclose(w(params), [-0.4, 0])


def test_staleness_modulation_scales_the_learning_rate():
    params = shard(lr_staleness_modulation=True)
    for seq in range(4):
        push(params, 0, seq + 1, seq, [0, 0])
    push(params, 1, 1, 0, [1, 1], ([3], [[1.0, 2.0]]))  # staleness 4: lr 0.1 / 4
    np.testing.assert_allclose(w(params), [-0.025, -0.025], rtol=1e-6)
    rows, _ = params.pull_embeddings([("t", np.array([3]))])
    np.testing.assert_allclose(rows["t"], [[-0.025, -0.05]], rtol=1e-6)
    push(params, 1, 2, 5, [1, 1])  # fresh again: the full rate
    np.testing.assert_allclose(w(params), [-0.125, -0.125], rtol=1e-6)


@pytest.mark.parametrize("staleness, applied", [(2, True), (3, False)])
def test_max_staleness_bound(staleness, applied):
    params = shard(max_staleness=2)
    for seq in range(5):
        push(params, 0, seq + 1, seq, [0, 0])
    result = push(params, 1, 1, 5 - staleness, [1, 1])
    assert result.accepted is applied and result.stale is not applied
    np.testing.assert_allclose(w(params), [-0.1, -0.1] if applied else [0, 0])
    assert params.staleness.rejections == (0 if applied else 1)


@pytest.mark.parametrize("policy, version, push_version, why", [
    (dict(grads_to_wait=2), 3, 3, ""),
    (dict(grads_to_wait=2), 3, 2, "the shard is at version 3"),
    (dict(), 3, 0, ""),
    (dict(max_staleness=2), 3, 1, ""),
    (dict(max_staleness=2), 3, 0, "computed against version 0, the shard is at version 3"),
    (dict(), 3, 4, "has not reached (it was restored)"),
])
def test_why_stale_names_the_versions_of_a_refused_push(policy, version, push_version, why):
    reason = UpdatePolicy(**policy).why_stale(version, push_version)
    assert why in reason and bool(reason) is bool(why)
