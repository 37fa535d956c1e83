"""`ps_tables`: finding PS-backed tables and serving large plain Keras Embeddings from the PS."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.layers import (
    Embedding,
    LookupContext,
    TableSpec,
    is_rewired,
    load_table_rows,
    lookup_context,
    merge_row_gradients,
    ps_tables,
)

VOCAB, DIM = 300, 4
THRESHOLD = VOCAB * DIM - 1  # the plain Embedding of these tests is just above it


def test_finds_elastic_embeddings_and_groups_shared_tables():
    a = keras.Input(shape=(2,), dtype="int64")
    b = keras.Input(shape=(2,), dtype="int64")
    first = Embedding(DIM, combiner="sum", table="shared", embeddings_initializer="zeros")
    second = Embedding(DIM, combiner="mean", table="shared", embeddings_initializer="zeros")
    own = Embedding(DIM + 1, input_dim=50, combiner="sum", name="own")
    out = keras.layers.Concatenate()([first(a), second(b), own(a)])
    specs = ps_tables(keras.Model([a, b], out))
    assert [s.name for s in specs] == ["shared", "own"]
    shared, own_spec = specs
    assert shared.layers == (first, second) and own_spec.layers == (own,)
    assert (shared.dim, shared.input_dim, shared.dtype) == (DIM, 0, "float32")
    assert shared.initializer_config["class_name"] == "Zeros"
    assert (own_spec.dim, own_spec.input_dim) == (DIM + 1, 50)
    assert shared.replaced_variables == () and own_spec.replaced_variables == ()


def test_layers_sharing_a_table_must_agree():
    ids = keras.Input(shape=(2,), dtype="int64")
    out = keras.layers.Concatenate()([
        Embedding(DIM, combiner="sum", table="t", name="narrow")(ids),
        Embedding(DIM + 1, combiner="sum", table="t", name="wide")(ids),
    ])
    with pytest.raises(ValueError, match="'narrow' has .* and 'wide' has"):
        ps_tables(keras.Model(ids, out))


def test_small_plain_embeddings_stay_dense():
    model = keras.Sequential([keras.Input(shape=(2,), dtype="int64"),
                              keras.layers.Embedding(VOCAB, DIM)])
    model.build()
    assert ps_tables(model, threshold_params=VOCAB * DIM) == []
    assert not is_rewired(model.layers[0])


def test_bad_threshold_and_unbuilt_layers_are_errors():
    model = keras.Sequential([keras.layers.Embedding(VOCAB, DIM)])
    with pytest.raises(ValueError, match="threshold_params"):
        ps_tables(model, threshold_params=-1)
    with pytest.raises(ValueError, match="not built"):
        ps_tables(model, threshold_params=0)


# -- a large plain Embedding served from the PS ---------------------------------------------


def _functional():
    ids = keras.Input(shape=(None,), dtype="int64")
    dense = keras.Input(shape=(2,))
    vectors = keras.layers.Embedding(VOCAB, DIM, mask_zero=True, name="words")(ids)
    pooled = keras.layers.GlobalAveragePooling1D()(vectors)  # uses the mask
    out = keras.layers.Dense(1)(keras.layers.Concatenate()([pooled, dense]))
    return keras.Model([ids, dense], out)


class Bag(keras.Model):
    def __init__(self):
        super().__init__()
        self.words = keras.layers.Embedding(VOCAB, DIM, name="words")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        ids, dense = inputs
        pooled = keras.ops.sum(self.words(ids), axis=1)
        return self.out(keras.ops.concatenate([pooled, dense], axis=-1))


def _features(seed):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, VOCAB, (6, 5))
    ids[:, -2:] = 0  # padding
    return ids, rng.normal(size=(6, 2)).astype(np.float32)


@pytest.mark.parametrize("make", [_functional, Bag], ids=["functional", "subclassed"])
def test_rewired_plain_embedding_matches_the_original(store, make):
    model = make()
    features, labels = _features(0), np.ones((6, 1), np.float32)
    model(features)
    words = next(layer for layer in model.layers if layer.name == "words")
    table = words.embeddings.numpy()

    with tf.GradientTape() as tape:
        loss = tf.reduce_mean(tf.square(model(features) - labels))
    want_grads = tape.gradient(loss, model.trainable_variables)
    want_out = model(features).numpy()

    (spec,) = ps_tables(model, threshold_params=THRESHOLD)
    assert is_rewired(words)
    assert spec == TableSpec("words", DIM, VOCAB, spec.initializer_config, "float32",
                             (words,), (words.embeddings,))
    assert spec.initializer_config["class_name"] == "RandomUniform"
    replaced = {id(v) for v in spec.replaced_variables}
    dense_vars = [v for v in model.trainable_variables if id(v) not in replaced]
    store.set_rows("words", np.arange(VOCAB), table)

    @tf.function
    def step(features, labels):
        with tf.GradientTape() as tape:
            ctx = LookupContext(store, tape)
            with lookup_context(ctx):
                out = model(features, training=True)
                loss = tf.reduce_mean(tf.square(out - labels))
        grads = tape.gradient(loss, dense_vars + [r.rows for r in ctx.records])
        n = len(dense_vars)
        return out, [(r.table, r.unique_ids) for r in ctx.records], grads[:n], grads[n:]

    out, looked_up, grads, row_grads = step(features, labels)
    np.testing.assert_allclose(out.numpy(), want_out, atol=1e-6)
    ids, summed = merge_row_gradients(looked_up, row_grads)["words"]
    table_grad = tf.convert_to_tensor(want_grads[0]).numpy()
    assert sorted(ids.tolist()) == np.unique(features[0]).tolist()
    np.testing.assert_allclose(summed, table_grad[ids], atol=1e-6)
    for got, want in zip(grads, want_grads[1:]):
        np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-6)
    assert len(store.calls) == 1  # one lookup, of the distinct ids


def test_rewired_layer_outside_a_context_uses_its_own_variable():
    layer = keras.layers.Embedding(VOCAB, DIM)
    model = keras.Sequential([keras.Input(shape=(3,), dtype="int64"), layer])
    ps_tables(model, threshold_params=THRESHOLD)
    out = model(np.array([[1, 2, 3]]))
    np.testing.assert_allclose(out.numpy()[0], layer.embeddings.numpy()[[1, 2, 3]])


def test_rewiring_twice_changes_nothing():
    model = keras.Sequential([keras.Input(shape=(3,), dtype="int64"),
                              keras.layers.Embedding(VOCAB, DIM)])
    first = ps_tables(model, threshold_params=THRESHOLD)
    call = model.layers[0].call
    assert ps_tables(model, threshold_params=THRESHOLD) == first
    assert model.layers[0].call == call


def test_rewired_regularizer_applies_to_looked_up_rows(store):
    layer = keras.layers.Embedding(VOCAB, DIM, embeddings_regularizer=keras.regularizers.L2(1.0))
    model = keras.Sequential([keras.Input(shape=(3,), dtype="int64"), layer])
    ps_tables(model, threshold_params=THRESHOLD)
    with lookup_context(LookupContext(store)):
        model(np.array([[4, 4, 9]]))
    assert len(model.losses) == 1
    want = np.sum(store.rows(layer.name, [4, 9]) ** 2)
    np.testing.assert_allclose(float(model.losses[0]), want, rtol=1e-5)


def test_rewired_layer_checks_its_id_range(store):
    model = keras.Sequential([keras.Input(shape=(1,), dtype="int64"),
                              keras.layers.Embedding(VOCAB, DIM)])
    ps_tables(model, threshold_params=THRESHOLD)
    with lookup_context(LookupContext(store)):
        with pytest.raises(tf.errors.InvalidArgumentError, match=f"input_dim={VOCAB}"):
            model(np.array([[VOCAB]]))


def test_load_table_rows_gives_a_plain_embedding_back():
    layer = keras.layers.Embedding(VOCAB, DIM, embeddings_regularizer="l2")
    model = keras.Sequential([keras.Input(shape=(2,), dtype="int64"), layer])
    (spec,) = ps_tables(model, threshold_params=THRESHOLD)
    rows = np.random.default_rng(0).normal(size=(2, DIM)).astype(np.float32)
    load_table_rows(spec, np.array([7, 3]), rows, default_row=np.full(DIM, 0.5))
    assert not is_rewired(layer)
    assert "call" not in vars(layer)
    assert layer.embeddings.regularizer is not None
    out = model(np.array([[3, 7], [1, 7]])).numpy()
    np.testing.assert_allclose(out[0], rows[[1, 0]])
    np.testing.assert_allclose(out[1], [np.full(DIM, 0.5), rows[0]])
    with pytest.raises(ValueError, match=r"\[0, input_dim=300\)"):
        load_table_rows(spec, np.array([VOCAB]), rows[:1])


def test_a_constrained_embedding_is_not_served_from_the_ps():
    ids = keras.Input((2,), dtype="int64")
    layer = keras.layers.Embedding(VOCAB, DIM, embeddings_constraint=keras.constraints.NonNeg())
    model = keras.Model(ids, layer(ids))
    with pytest.raises(ModelSpecError, match="embeddings_constraint=NonNeg"):
        ps_tables(model, threshold_params=THRESHOLD)
    assert ps_tables(model, threshold_params=VOCAB * DIM) == []  # kept dense, constrained


def test_a_tables_lifecycle_comes_from_its_layers_which_must_agree():
    ids = keras.Input(shape=(2,), dtype="int64")
    model = keras.Model(ids, Embedding(DIM, admit_after=2, table="t", name="a")(ids))
    (spec,) = ps_tables(model)
    assert spec.lifecycle == {"admit_after": 2}
    other = Embedding(DIM, admit_after=5, table="t", name="b")(ids)
    both = keras.Model(ids, Embedding(DIM, admit_after=2, table="t", name="c")(ids) + other)
    with pytest.raises(ValueError, match="agree on .*lifecycle"):
        ps_tables(both)



def test_a_plain_embedding_shares_a_table_with_a_layer_that_sets_no_lifecycle():
    ids = keras.Input(shape=(2,), dtype="int64")
    plain = keras.layers.Embedding(VOCAB, DIM, name="shared")
    model = keras.Model(ids, plain(ids) + Embedding(DIM, input_dim=VOCAB,
                                                    table="shared", name="b")(ids))
    model(np.zeros((1, 2), np.int64))
    (spec,) = ps_tables(model, threshold_params=1000)
    assert spec.lifecycle == {} and len(spec.layers) == 2
