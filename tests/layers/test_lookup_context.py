"""The lookup context: records, tape, row-gradient merging, and a whole step's gradients."""

import threading

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.layers import (
    Embedding,
    LookupContext,
    current_context,
    lookup_context,
    merge_row_gradients,
)

VOCAB, DIM = 20, 4


def test_records_each_call_with_its_unique_ids(store):
    layer = Embedding(DIM, table="t")
    with lookup_context(LookupContext(store)) as ctx:
        layer(tf.constant([[3, 5, 3]]))
        layer(tf.constant([[5, 7]]))
    assert [r.table for r in ctx.records] == ["t", "t"]
    assert [r.unique_ids.numpy().tolist() for r in ctx.records] == [[3, 5], [5, 7]]
    np.testing.assert_allclose(ctx.records[0].rows.numpy(), store.rows("t", [3, 5]))


def test_context_is_current_only_inside_and_only_on_its_thread(store):
    ctx = LookupContext(store)
    seen = []
    with lookup_context(ctx):
        assert current_context() is ctx
        thread = threading.Thread(target=lambda: seen.append(current_context()))
        thread.start()
        thread.join()
    assert current_context() is None
    assert seen == [None]


def test_nested_contexts_restore_the_outer_one(store):
    outer, inner = LookupContext(store), LookupContext(store)
    with lookup_context(outer):
        with lookup_context(inner):
            assert current_context() is inner
        assert current_context() is outer


def test_rejects_a_lookup_fn_that_is_not_callable():
    with pytest.raises(ValueError, match="lookup_fn"):
        LookupContext("not a function")


def test_shared_table_with_two_dims_is_an_error(store):
    with lookup_context(LookupContext(store)):
        Embedding(DIM, table="t")(tf.constant([1]))
        with pytest.raises(ValueError, match="same output_dim"):
            Embedding(DIM + 1, table="t")(tf.constant([1]))


def test_lookup_fn_returning_wrong_shape_is_an_error():
    with lookup_context(LookupContext(lambda table, ids: np.zeros((1, 2)))):
        with pytest.raises(Exception, match="one row of 4 values per id"):
            Embedding(DIM)(tf.constant([1, 2]))


def test_empty_batch_does_not_call_lookup_fn(store):
    with lookup_context(LookupContext(store)):
        out = Embedding(DIM, combiner="sum")(tf.ragged.constant([[], []], dtype=tf.int64))
    assert out.shape == (2, DIM)
    assert store.calls == []


def test_merge_sums_duplicate_ids_across_records():
    merged = merge_row_gradients(
        [("a", np.array([3, 1])), (b"a", np.array([1, 9])), (tf.constant("b"), np.array([1]))],
        [np.array([[1.0, 1.0], [2.0, 2.0]]), np.array([[10.0, 10.0], [5.0, 5.0]]),
         np.array([[7.0, 7.0]])],
    )
    assert sorted(merged) == ["a", "b"]
    ids, grads = merged["a"]
    assert ids.tolist() == [1, 3, 9]
    np.testing.assert_allclose(grads, [[12, 12], [1, 1], [5, 5]])
    assert merged["b"][0].tolist() == [1]


def test_merge_accepts_indexed_slices_and_skips_none():
    slices = tf.IndexedSlices(tf.constant([[1.0], [2.0], [3.0]]), tf.constant([0, 1, 0]),
                              tf.constant([2, 1]))
    merged = merge_row_gradients([("a", np.array([4, 2])), ("b", np.array([1]))],
                                 [slices, None])
    assert list(merged) == ["a"]
    ids, grads = merged["a"]
    assert ids.tolist() == [4, 2]  # one record: its ids, in its order
    np.testing.assert_allclose(grads, [[4.0], [2.0]])


def test_merge_keeps_a_table_looked_up_once_as_it_is():
    ids = np.array([9, 3, 5])
    grads = np.arange(6.0).reshape(3, 2)
    merged = merge_row_gradients([("a", ids), ("b", np.array([3, 1])), ("b", np.array([1]))],
                                 [grads, np.ones((2, 2)), np.ones((1, 2))])
    assert merged["a"][0].tolist() == [9, 3, 5]  # no sort
    assert np.shares_memory(merged["a"][0], ids) and merged["a"][1] is grads  # no copy
    assert merged["b"][0].tolist() == [1, 3]
    np.testing.assert_allclose(merged["b"][1], [[2, 2], [1, 1]])


def test_merge_rejects_mismatched_lengths_and_shapes():
    with pytest.raises(ValueError, match="one gradient per lookup"):
        merge_row_gradients([("a", np.array([1]))], [])
    with pytest.raises(ValueError, match="one row per looked-up id"):
        merge_row_gradients([("a", np.array([1, 2]))], [np.zeros((3, 2))])


# -- a whole training step ----------------------------------------------------------------


def _dense_model(weights):
    a = keras.Input(shape=(3,), dtype="int64")
    b = keras.Input(shape=(2,), dtype="int64")
    shared = keras.layers.Embedding(VOCAB, DIM)
    pooled_a = keras.ops.mean(shared(a), axis=1)
    pooled_b = keras.ops.sum(shared(b), axis=1)
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([pooled_a, pooled_b]))
    model = keras.Model([a, b], out)
    model.set_weights(weights)
    return model


def _ps_model(dense_weights):
    a = keras.Input(shape=(3,), dtype="int64")
    b = keras.Input(shape=(2,), dtype="int64")
    pooled_a = Embedding(DIM, combiner="mean", table="shared")(a)
    pooled_b = Embedding(DIM, combiner="sum", table="shared")(b)
    dense = keras.layers.Dense(1)
    out = dense(keras.layers.Concatenate()([pooled_a, pooled_b]))
    model = keras.Model([a, b], out)
    dense.set_weights(dense_weights)
    return model


def _batches(seed):
    rng = np.random.default_rng(seed)
    for _ in range(2):
        yield ((rng.integers(0, VOCAB, (5, 3)), rng.integers(0, VOCAB, (5, 2))),
               rng.normal(size=(5, 1)).astype(np.float32))


@pytest.mark.parametrize("compiled", [True, False], ids=["tf_function", "eager"])
def test_row_gradients_equal_a_dense_keras_embedding(store, compiled):
    rng = np.random.default_rng(1)
    table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
    kernel = rng.normal(size=(2 * DIM, 1)).astype(np.float32)
    bias = np.array([0.3], np.float32)
    dense_model = _dense_model([table, kernel, bias])
    ps_model = _ps_model([kernel, bias])
    store.set_rows("shared", np.arange(VOCAB), table)

    def ps_step(features, labels):
        with tf.GradientTape() as tape:
            ctx = LookupContext(store, tape)
            with lookup_context(ctx):
                loss = tf.reduce_mean(tf.square(ps_model(features, training=True) - labels))
        targets = ps_model.trainable_variables + [r.rows for r in ctx.records]
        grads = tape.gradient(loss, targets)
        n = len(ps_model.trainable_variables)
        return loss, [(r.table, r.unique_ids) for r in ctx.records], grads[:n], grads[n:]

    step = tf.function(ps_step) if compiled else ps_step
    for features, labels in _batches(2):
        with tf.GradientTape() as tape:
            dense_loss = tf.reduce_mean(tf.square(dense_model(features) - labels))
        dense_grads = tape.gradient(dense_loss, dense_model.trainable_variables)
        table_grad = tf.convert_to_tensor(dense_grads[0]).numpy()

        loss, looked_up, grads, row_grads = step(features, labels)
        assert len(looked_up) == 2
        merged = merge_row_gradients(looked_up, row_grads)
        ids, summed = merged["shared"]

        np.testing.assert_allclose(float(loss), float(dense_loss), atol=1e-6)
        assert ids.tolist() == np.unique(np.concatenate([f.ravel() for f in features])).tolist()
        np.testing.assert_allclose(summed, table_grad[ids], atol=1e-6)
        untouched = np.setdiff1d(np.arange(VOCAB), ids)
        np.testing.assert_array_equal(table_grad[untouched], 0)
        for got, want in zip(grads, dense_grads[1:]):
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
