"""Export: tables loaded into the model serve from a SavedModel without this package."""

import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.layers import Embedding, load_table_rows, ps_tables

DIM = 4

# Runs in a fresh `python -I` (no PYTHONPATH, no user site, cwd outside the repository) that
# also refuses any import of elastic_keras, even through the editable install's hook.
SERVE = textwrap.dedent("""
    import sys

    class Refuse:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "elastic_keras":
                raise ImportError("elastic_keras must not be needed to serve")

    sys.meta_path.insert(0, Refuse())
    import numpy as np
    import tensorflow as tf

    inputs = np.load("inputs.npz")
    features = []
    for i in range(int(inputs["count"])):
        if f"{i}" in inputs:
            value = inputs[f"{i}"]
            features.append(tf.constant(value.astype(bytes) if value.dtype.kind == "U" else value))
        else:
            features.append(tf.RaggedTensor.from_row_lengths(inputs[f"{i}_values"],
                                                             inputs[f"{i}_lengths"]))
    served = tf.saved_model.load("model")
    out = served.serve(features)
    assert not any(m.startswith("elastic_keras") for m in sys.modules)
    np.save("served.npy", out.numpy())
""")


def _serve_in_clean_python(tmp_path, features):
    """The exported model's predictions, computed by a Python that cannot import us."""
    arrays = {"count": len(features)}
    for i, feature in enumerate(features):
        if isinstance(feature, tf.RaggedTensor):
            arrays[f"{i}_values"] = feature.values.numpy()
            arrays[f"{i}_lengths"] = feature.row_lengths().numpy()
        else:
            value = feature.numpy()
            arrays[f"{i}"] = value.astype(str) if value.dtype == object else value
    np.savez(tmp_path / "inputs.npz", **arrays)
    result = subprocess.run([sys.executable, "-I", "-c", SERVE], cwd=tmp_path,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    return np.load(tmp_path / "served.npy")


def _model():
    bounded = keras.Input(shape=(3,), dtype="int64", name="bounded")
    user = keras.Input(shape=(None,), ragged=True, dtype="int64", name="user")
    words = keras.Input(shape=(), dtype="string", name="words")
    plain = keras.Input(shape=(2,), dtype="int64", name="plain")
    merged = keras.layers.Concatenate()([
        Embedding(DIM, input_dim=10, combiner="sum", mask_zero=True, name="slots")(bounded),
        Embedding(DIM, combiner="mean", table="user")(user),
        Embedding(DIM, table="word")(words),
        keras.layers.Flatten()(keras.layers.Embedding(300, DIM, name="plain_table")(plain)),
    ])
    out = keras.layers.Dense(3)(merged)
    return keras.Model([bounded, user, words, plain], out)


def _inputs():
    return {
        # seen: 1..6; unseen: 8, 9 (bounded: default row); 0 is padding
        "bounded": np.array([[1, 2, 0], [9, 6, 8], [0, 0, 0]], np.int64),
        # seen: -5, 2**62; unseen: 77
        "user_values": np.array([-5, 2**62, 77, 2**62], np.int64),
        "user_lengths": np.array([2, 1, 1], np.int64),
        "words": np.array(["apple", "unseen word", "pear"]),
        "plain": np.array([[1, 299], [5, 1], [0, 7]], np.int64),
    }


def _features(inputs):
    return [
        tf.constant(inputs["bounded"]),
        tf.RaggedTensor.from_row_lengths(inputs["user_values"], inputs["user_lengths"]),
        tf.constant(inputs["words"]),
        tf.constant(inputs["plain"]),
    ]


def _export(model, features, path):
    """`model.export(path)`, but with the input signature of `features`.

    Keras' own `model.export` derives a dense `TensorSpec` from a ragged `keras.Input` (and
    rejects a `tf.RaggedTensorSpec`), so a model with ragged inputs is exported through an
    `ExportArchive` whose endpoint is a `tf.function` traced on the features' own specs.
    """
    specs = tf.nest.map_structure(lambda t: _any_batch(tf.type_spec_from_value(t)), features)
    serve = tf.function(lambda inputs: model(inputs, training=False), input_signature=[specs])
    serve.get_concrete_function()
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint("serve", serve)
    archive.write_out(path, verbose=False)


def _any_batch(spec):
    shape = [None] + spec.shape[1:].as_list()
    if isinstance(spec, tf.RaggedTensorSpec):
        return tf.RaggedTensorSpec(shape, spec.dtype, spec.ragged_rank, spec.row_splits_dtype)
    if isinstance(spec, tf.SparseTensorSpec):
        return tf.SparseTensorSpec(shape, spec.dtype)
    return tf.TensorSpec(shape, spec.dtype)


def _hashed(words):
    return tf.strings.to_hash_bucket_fast(words, 2**63 - 1).numpy()


@pytest.mark.timeout(300)
def test_exported_tables_serve_in_a_clean_python(tmp_path):
    keras.utils.set_random_seed(0)
    model = _model()
    inputs = _inputs()
    model(_features(inputs))  # built as a worker or the exporter builds it

    rng = np.random.default_rng(0)
    known = {
        "slots": np.arange(1, 7),
        "user": np.array([-5, 2**62, 3]),
        "word": _hashed(["apple", "pear", "plum"]),
        "plain_table": np.array([1, 5, 299]),
    }
    specs = ps_tables(model, threshold_params=300 * DIM - 1)
    assert sorted(s.name for s in specs) == sorted(known)
    rows = {}
    for spec in specs:
        rows[spec.name] = rng.normal(size=(known[spec.name].size, DIM)).astype(np.float32)
        load_table_rows(spec, known[spec.name], rows[spec.name])

    expected = model(_features(inputs)).numpy()
    user_layer = next(layer for layer in model.layers if getattr(layer, "table", None) == "user")
    unseen_user = user_layer(tf.ragged.constant([[77]], dtype=tf.int64)).numpy()
    np.testing.assert_array_equal(unseen_user, np.zeros((1, DIM)))
    word_layer = next(layer for layer in model.layers if getattr(layer, "table", None) == "word")
    np.testing.assert_allclose(word_layer(tf.constant(["pear"])).numpy()[0], rows["word"][1])

    _export(model, _features(inputs), str(tmp_path / "model"))
    served = _serve_in_clean_python(tmp_path, _features(inputs))
    np.testing.assert_allclose(served, expected, atol=1e-6)


@pytest.mark.timeout(300)
def test_model_export_of_dense_inputs(tmp_path):
    slots = keras.Input(shape=(3,), dtype="int64")
    users = keras.Input(shape=(2,), dtype="int64")
    merged = keras.layers.Concatenate()([
        Embedding(DIM, input_dim=10, combiner="sqrtn")(slots),
        Embedding(DIM, combiner="mean", mask_zero=True)(users),
    ])
    model = keras.Model([slots, users], keras.layers.Dense(2)(merged))
    features = [tf.constant([[1, 2, 3], [4, 9, 9]], tf.int64),
                tf.constant([[7, 0], [2**40, 5]], tf.int64)]
    model(features)
    rng = np.random.default_rng(1)
    for spec, ids in zip(ps_tables(model), [np.arange(10), np.array([7, 11])]):
        load_table_rows(spec, ids, rng.normal(size=(ids.size, DIM)))
    expected = model(features).numpy()

    model.export(str(tmp_path / "model"), verbose=False)
    np.testing.assert_allclose(_serve_in_clean_python(tmp_path, features), expected, atol=1e-6)


def test_load_table_checks_its_arguments():
    bounded = Embedding(DIM, input_dim=10)
    with pytest.raises(ValueError, match=r"\[0, input_dim=10\)"):
        bounded.load_table([3, 10], np.zeros((2, DIM)))
    with pytest.raises(ValueError, match="distinct"):
        bounded.load_table([3, 3], np.zeros((2, DIM)))
    with pytest.raises(ValueError, match=r"shape \[len\(ids\), output_dim\]"):
        bounded.load_table([3], np.zeros((1, DIM + 1)))
    with pytest.raises(ValueError, match="default_row"):
        bounded.load_table([3], np.zeros((1, DIM)), default_row=np.zeros(2))
    bounded.load_table([3], np.ones((1, DIM)), default_row=np.full(DIM, 2.0))
    np.testing.assert_allclose(bounded(tf.constant([3, 4])).numpy(), [[1] * DIM, [2] * DIM])
    with pytest.raises(ValueError, match="already"):
        bounded.load_table([3], np.zeros((1, DIM)))


def test_unbounded_table_serves_rows_and_a_default_row():
    layer = Embedding(DIM, combiner="sum")
    layer.load_table([-(2**63), 2**63 - 1], np.ones((2, DIM)))
    assert layer.loaded
    out = layer(tf.constant([[-(2**63), 2**63 - 1], [5, 2**63 - 1]], tf.int64)).numpy()
    np.testing.assert_allclose(out, [[2] * DIM, [1] * DIM])
