"""`Embedding`: shapes and values for every input kind and combiner, masks, checks, models."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.layers import Embedding, LookupContext, lookup_context

DIM = 4


def _combine(rows, combiner):
    """numpy reference of a combiner over the rows of one example (`[n, dim]`)."""
    if len(rows) == 0:
        return np.zeros(DIM, np.float32)
    total = rows.sum(axis=0)
    return {"sum": total, "mean": total / len(rows), "sqrtn": total / np.sqrt(len(rows))}[combiner]


def _call(store, layer, inputs):
    with lookup_context(LookupContext(store)):
        return layer(inputs)


# -- shapes and values ----------------------------------------------------------------------


def test_dense_ids_without_combiner(store):
    ids = np.array([[1, 2, 3], [3, 4, -5]])
    out = _call(store, Embedding(DIM, table="t"), ids)
    assert out.shape == (2, 3, DIM)
    np.testing.assert_allclose(out.numpy(), store.rows("t", ids))


def test_rank_one_ids_without_combiner(store):
    out = _call(store, Embedding(DIM, table="t"), tf.constant([7, 2**62], tf.int64))
    assert out.shape == (2, DIM)
    np.testing.assert_allclose(out.numpy(), store.rows("t", [7, 2**62]))


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_dense_ids_with_combiner(store, combiner):
    ids = np.array([[1, 2, 2], [5, -3, 9]])
    out = _call(store, Embedding(DIM, combiner=combiner, table="t"), ids)
    assert out.shape == (2, DIM)
    want = [_combine(store.rows("t", row), combiner) for row in ids]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_ragged_ids_with_combiner(store, combiner):
    rows = [[1, 2, 3], [], [4], [2, 2]]
    out = _call(store, Embedding(DIM, combiner=combiner, table="t"),
                tf.ragged.constant(rows, dtype=tf.int64))
    assert out.shape == (4, DIM)
    want = [_combine(store.rows("t", np.array(r, np.int64)), combiner) for r in rows]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_sparse_ids_with_combiner(store, combiner):
    ids = tf.SparseTensor(indices=[[0, 0], [0, 3], [2, 1], [3, 0], [3, 2]],
                          values=tf.constant([10, 11, 12, 10, 13], tf.int64),
                          dense_shape=[5, 4])
    out = _call(store, Embedding(DIM, combiner=combiner, table="t"), ids)
    assert out.shape == (5, DIM)
    per_row = [[10, 11], [], [12], [10, 13], []]
    want = [_combine(store.rows("t", np.array(r, np.int64)), combiner) for r in per_row]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    np.testing.assert_array_equal(out.numpy()[[1, 4]], 0)


def test_sparse_ids_in_any_order(store):
    ids = tf.SparseTensor(indices=[[1, 0], [0, 0], [1, 1]], values=tf.constant([3, 4, 5]),
                          dense_shape=[2, 2])
    out = _call(store, Embedding(DIM, combiner="sum", table="t"), ids)
    np.testing.assert_allclose(out.numpy(), [store.rows("t", [4])[0],
                                             store.rows("t", [3, 5]).sum(0)], rtol=1e-6)


def test_higher_rank_ids_reduce_the_last_axis(store):
    dense = np.arange(24).reshape(2, 3, 4)
    out = _call(store, Embedding(DIM, combiner="sum", table="t"), dense)
    assert out.shape == (2, 3, DIM)
    np.testing.assert_allclose(out.numpy(), store.rows("t", dense).sum(axis=2), rtol=1e-6)

    ragged = tf.ragged.constant([[[1, 2], [3]], [[4, 5, 6]]], dtype=tf.int64)
    out = _call(store, Embedding(DIM, combiner="mean", table="t"), ragged)
    assert isinstance(out, tf.RaggedTensor)
    assert out.shape.as_list() == [2, None, DIM]
    np.testing.assert_allclose(out[1][0].numpy(), store.rows("t", [4, 5, 6]).mean(0), rtol=1e-6)

    sparse = tf.sparse.from_dense(tf.constant([[[1, 0], [0, 0]], [[2, 3], [0, 4]]]))
    out = _call(store, Embedding(DIM, combiner="sum", table="t"), sparse)
    assert out.shape == (2, 2, DIM)
    np.testing.assert_allclose(out.numpy()[1, 0], store.rows("t", [2, 3]).sum(0), rtol=1e-6)
    np.testing.assert_array_equal(out.numpy()[0, 1], 0)


@pytest.mark.parametrize("ids", [tf.ragged.constant([[1], [2, 3]]),
                                 tf.sparse.from_dense(tf.constant([[1, 0]]))],
                         ids=["ragged", "sparse"])
def test_ragged_or_sparse_without_combiner_is_an_error(store, ids):
    with pytest.raises(ValueError, match="need combiner"):
        _call(store, Embedding(DIM), ids)


def test_ragged_without_combiner_fails_when_building_a_functional_model():
    with pytest.raises(ValueError, match="need combiner"):
        Embedding(DIM)(keras.Input(shape=(None,), ragged=True, dtype="int64"))


def test_string_ids_are_hashed_in_graph(store):
    words = tf.constant([["a", "b"], ["b", "zz"]])
    out = _call(store, Embedding(DIM, table="t"), words)
    hashed = tf.strings.to_hash_bucket_fast(words, 2**63 - 1).numpy()
    np.testing.assert_allclose(out.numpy(), store.rows("t", hashed))
    assert out.numpy()[0, 1].tolist() == out.numpy()[1, 0].tolist()


def test_string_ids_of_a_bounded_table_hash_into_its_range(store):
    layer = Embedding(DIM, input_dim=10, combiner="sum", table="t")
    _call(store, layer, tf.ragged.constant([["x", "y", "z"]]))
    assert all(0 <= i < 10 for i in store.calls[0][1])


def test_lookup_fn_sees_each_unique_id_once_per_call(store):
    layer = Embedding(DIM, combiner="sum", table="t")
    _call(store, layer, np.array([[5, 5, 5], [1, 5, 1]]))
    assert len(store.calls) == 1
    assert sorted(store.calls[0][1].tolist()) == [1, 5]


def test_outside_a_context_rows_are_zero(store):
    out = Embedding(DIM)(np.array([[1, 2]]))
    np.testing.assert_array_equal(out.numpy(), np.zeros((1, 2, DIM)))
    assert store.calls == []


# -- masks ------------------------------------------------------------------------------------


def test_mask_zero_without_combiner_gives_a_mask(store):
    layer = Embedding(DIM, mask_zero=True, table="t")
    ids = tf.constant([[3, 0, 4], [0, 0, 1]])
    np.testing.assert_array_equal(layer.compute_mask(ids).numpy(), ids.numpy() != 0)
    out = _call(store, layer, ids)
    np.testing.assert_array_equal(out._keras_mask.numpy(), ids.numpy() != 0)
    words = tf.constant([["a", ""]])
    np.testing.assert_array_equal(layer.compute_mask(words).numpy(), [[True, False]])


def test_mask_zero_flows_into_a_masked_pooling_layer(store):
    ids = keras.Input(shape=(None,), dtype="int64")
    pooled = keras.layers.GlobalAveragePooling1D()(Embedding(DIM, mask_zero=True, table="t")(ids))
    model = keras.Model(ids, pooled)
    out = _call(store, model, np.array([[3, 4, 0, 0]]))
    np.testing.assert_allclose(out.numpy()[0], store.rows("t", [3, 4]).mean(0), rtol=1e-6)


@pytest.mark.parametrize("combiner", ["sum", "mean", "sqrtn"])
def test_mask_zero_with_combiner_leaves_padding_out(store, combiner):
    layer = Embedding(DIM, combiner=combiner, mask_zero=True, table="t")
    out = _call(store, layer, np.array([[3, 0, 4, 0], [0, 0, 0, 0]]))
    want = [_combine(store.rows("t", [3, 4]), combiner), np.zeros(DIM)]
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)
    assert 0 not in store.calls[0][1].tolist()
    assert layer.compute_mask(tf.constant([[1, 0]])) is None


def test_mask_zero_with_combiner_leaves_empty_strings_out(store):
    layer = Embedding(DIM, combiner="mean", mask_zero=True, table="t")
    out = _call(store, layer, tf.constant([["a", ""]]))
    hashed = tf.strings.to_hash_bucket_fast(["a"], 2**63 - 1).numpy()
    np.testing.assert_allclose(out.numpy()[0], store.rows("t", hashed)[0], rtol=1e-6)


# -- regularizer, bounds, arguments, config -----------------------------------------------


def test_regularizer_loss_on_looked_up_rows_is_in_model_losses(store):
    ids = keras.Input(shape=(3,), dtype="int64")
    model = keras.Model(ids, Embedding(DIM, embeddings_regularizer=keras.regularizers.L2(0.5),
                                       combiner="sum", table="t")(ids))
    _call(store, model, np.array([[1, 2, 2]]))
    assert len(model.losses) == 1
    want = 0.5 * np.sum(store.rows("t", [1, 2]) ** 2)
    np.testing.assert_allclose(float(model.losses[0]), want, rtol=1e-5)


def test_ids_outside_a_bounded_range_are_an_error(store):
    layer = Embedding(DIM, input_dim=10, table="t")
    _call(store, layer, np.array([0, 9]))
    for bad in ([10], [-1]):
        with pytest.raises(tf.errors.InvalidArgumentError, match="input_dim=10|>= 0"):
            _call(store, layer, np.array(bad))

    @tf.function
    def traced(ids):
        with lookup_context(LookupContext(store)):
            return layer(ids)

    traced(tf.constant([1, 2]))
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_dim=10"):
        traced(tf.constant([3, 12]))


@pytest.mark.parametrize("kwargs, match", [
    ({"output_dim": 0}, "output_dim"),
    ({"output_dim": 4, "input_dim": -3}, "input_dim"),
    ({"output_dim": 4, "combiner": "max"}, "combiner"),
    ({"output_dim": 4, "table": ""}, "table"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Embedding(**kwargs)


def test_float_ids_are_cast_and_bool_ids_rejected(store):
    out = _call(store, Embedding(DIM, table="t"), tf.constant([3.0]))
    np.testing.assert_allclose(out.numpy(), store.rows("t", [3]))
    with pytest.raises(ValueError, match="integer or string ids"):
        _call(store, Embedding(DIM, table="t"), tf.constant([True]))


def test_spec_properties_for_the_worker():
    layer = Embedding(8, input_dim=100, embeddings_initializer="glorot_normal", name="e")
    assert (layer.table, layer.output_dim, layer.input_dim) == ("e", 8, 100)
    assert layer.initializer_config["class_name"] == "GlorotNormal"
    assert layer.variable_dtype == "float32"
    assert Embedding(8, table="shared").table == "shared"


def test_config_round_trip():
    layer = Embedding(6, input_dim=50, combiner="sqrtn", mask_zero=True, table="x",
                      embeddings_regularizer="l2", embeddings_initializer="zeros", name="emb")
    clone = Embedding.from_config(layer.get_config())
    assert clone.get_config() == layer.get_config()
    assert (clone.table, clone.combiner, clone.input_dim, clone.mask_zero) == ("x", "sqrtn", 50,
                                                                            True)


def test_model_with_the_layer_saves_and_loads_as_keras(tmp_path):
    ids = keras.Input(shape=(2,), dtype="int64")
    model = keras.Model(ids, Embedding(DIM, combiner="sum", table="user")(ids))
    model.save(tmp_path / "m.keras")
    loaded = keras.saving.load_model(tmp_path / "m.keras")
    assert loaded.layers[1].table == "user"


# -- model kinds ------------------------------------------------------------------------------


class TwoTables(keras.Model):
    def __init__(self):
        super().__init__()
        self.users = Embedding(DIM, combiner="mean", table="user")
        self.items = Embedding(DIM, table="item")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        users, items = inputs
        return self.out(keras.ops.concatenate([self.users(users), self.items(items)], axis=-1))


def _functional():
    users = keras.Input(shape=(None,), ragged=True, dtype="int64")
    items = keras.Input(shape=(), dtype="int64")
    merged = keras.layers.Concatenate()([Embedding(DIM, combiner="mean", table="user")(users),
                                         Embedding(DIM, table="item")(items)])
    return keras.Model([users, items], keras.layers.Dense(1)(merged))


@pytest.mark.parametrize("make", [_functional, TwoTables], ids=["functional", "subclassed"])
def test_models_train_through_the_context(store, make):
    model = make()
    features = (tf.ragged.constant([[1, 2], [3]], dtype=tf.int64), tf.constant([7, 8], tf.int64))
    model(features)  # builds the Dense layer with zero rows
    dense = model.layers[-1]
    kernel, bias = dense.kernel.numpy(), dense.bias.numpy()

    @tf.function
    def step(features):
        with tf.GradientTape() as tape:
            ctx = LookupContext(store, tape)
            with lookup_context(ctx):
                out = model(features, training=True)
            total = tf.reduce_sum(out)
        return out, tape.gradient(total, [r.rows for r in ctx.records])

    out, row_grads = step(features)
    user = np.stack([store.rows("user", [1, 2]).mean(0), store.rows("user", [3])[0]])
    want = np.concatenate([user, store.rows("item", [7, 8])], axis=1) @ kernel + bias
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    assert all(g is not None for g in row_grads)


def test_sequential_model(store):
    model = keras.Sequential([keras.Input(shape=(3,), dtype="int64"),
                              Embedding(DIM, combiner="sum", table="t"),
                              keras.layers.Dense(2)])
    out = _call(store, model, np.array([[1, 2, 3]]))
    assert out.shape == (1, 2)
    dense = model.layers[-1]
    want = store.rows("t", [1, 2, 3]).sum(0) @ dense.kernel.numpy() + dense.bias.numpy()
    # float32 sums in another order: an output near 0 differs in relative terms.
    np.testing.assert_allclose(out.numpy()[0], want, rtol=1e-5, atol=1e-6)


def test_functional_model_with_sparse_ids(store):
    ids = keras.Input(shape=(None,), sparse=True, dtype="int64")
    model = keras.Model(ids, Embedding(DIM, combiner="sqrtn", table="t")(ids))
    assert model.output_shape == (None, DIM)
    sparse = tf.SparseTensor([[0, 0], [0, 2], [2, 1]], tf.constant([4, 5, 6], tf.int64), [3, 3])
    out = _call(store, model, sparse)
    np.testing.assert_allclose(out.numpy(), [store.rows("t", [4, 5]).sum(0) / np.sqrt(2),
                                             np.zeros(DIM), store.rows("t", [6])[0]], rtol=1e-6)


def test_lifecycle_arguments_are_checked_and_kept_in_the_config():
    layer = Embedding(4, admit_after=3, idle_steps=1000, max_rows=50_000, name="ads")
    assert layer.lifecycle == {"admit_after": 3, "admit_probability": None,
                               "idle_steps": 1000, "max_rows": 50_000, "idle_seconds": None}
    assert Embedding.from_config(layer.get_config()).lifecycle == layer.lifecycle
    assert Embedding(4).lifecycle == dict.fromkeys(
        ("admit_after", "idle_steps", "max_rows", "admit_probability", "idle_seconds"))
    assert Embedding(4, idle_seconds=86400).lifecycle["idle_seconds"] == 86400.0
    assert Embedding(4, admit_probability=np.float32(0.5)).lifecycle["admit_probability"] == 0.5
    for bad, problem in [({"admit_after": -1}, "admit_after"), ({"max_rows": 2.5}, "max_rows"),
                         ({"admit_probability": 0}, "admit_probability"),
                         ({"admit_after": 300}, "from 0 to 255"),
                         ({"admit_after": 2, "admit_probability": 0.5}, "not both"),
                         ({"idle_seconds": float("nan")}, "idle_seconds"),
                         ({"idle_seconds": -1}, "idle_seconds")]:
        with pytest.raises(ValueError, match=problem):
            Embedding(4, **bad)
