import json
import math

import keras
import numpy as np
import pytest

from elastic_keras.common.embedding_init import SUPPORTED, check_initializer, initial_rows
from elastic_keras.common.errors import ModelSpecError

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
EXTREME_IDS = np.array([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, 2**40, -(2**40)])


def serialized(initializer):
    return keras.initializers.serialize(initializer)


INITIALIZERS = {
    "uniform": "uniform",
    "normal": serialized(keras.initializers.RandomNormal(mean=0.5, stddev=2.0)),
    "truncated": serialized(keras.initializers.TruncatedNormal(mean=-1.0, stddev=0.5)),
    "constant": serialized(keras.initializers.Constant(3.5)),
    "glorot_uniform": "glorot_uniform",
    "he_normal": serialized(keras.initializers.HeNormal(seed=7)),
    "variance_scaling": serialized(keras.initializers.VarianceScaling(
        scale=2.0, mode="fan_out", distribution="untruncated_normal")),
}


@pytest.mark.parametrize("name", sorted(INITIALIZERS))
def test_a_row_does_not_depend_on_the_other_ids_or_their_order(name):
    init = INITIALIZERS[name]
    rng = np.random.default_rng(0)
    ids = np.concatenate([EXTREME_IDS, rng.integers(INT64_MIN, INT64_MAX, 500, dtype=np.int64)])
    rows = initial_rows("table", ids, 7, init, input_dim=1000)
    order = rng.permutation(len(ids))[:300]
    again = initial_rows("table", ids[order], 7, init, input_dim=1000)
    np.testing.assert_array_equal(again, rows[order])
    for i in (0, 3, 4):  # one id at a time, extreme ids included
        one = initial_rows("table", ids[i:i + 1], 7, init, input_dim=1000)
        np.testing.assert_array_equal(one[0], rows[i])
    assert np.isfinite(rows).all()


def test_the_json_text_a_dict_and_a_name_give_the_same_rows():
    ids = np.arange(50)
    config = serialized(keras.initializers.RandomUniform(-0.05, 0.05))
    by_name = initial_rows("t", ids, 4, "uniform")
    np.testing.assert_array_equal(by_name, initial_rows("t", ids, 4, config))
    np.testing.assert_array_equal(by_name, initial_rows("t", ids, 4, json.dumps(config)))


def test_rows_differ_between_ids_tables_and_seeds():
    ids = np.arange(-5000, 5000)
    rows = initial_rows("t", ids, 8, "uniform")
    assert len(np.unique(rows, axis=0)) == len(ids)
    assert not np.array_equal(rows, initial_rows("other", ids, 8, "uniform"))
    seeded = serialized(keras.initializers.RandomUniform(seed=1))
    other_seed = serialized(keras.initializers.RandomUniform(seed=2))
    assert not np.array_equal(
        initial_rows("t", ids, 8, seeded), initial_rows("t", ids, 8, other_seed))
    # Columns of one row are not copies of each other either.
    assert len(np.unique(rows[:, 0])) > 0.99 * len(ids)
    assert abs(np.corrcoef(rows[:, 0], rows[:, 1])[0, 1]) < 0.05


STATISTICS = [  # initializer, input_dim, dim, expected mean, expected stddev, bound
    ("uniform", 0, 16, 0.0, 0.1 / math.sqrt(12), 0.05),
    (serialized(keras.initializers.RandomUniform(1.0, 3.0)), 0, 16, 2.0, 2 / math.sqrt(12), None),
    (serialized(keras.initializers.RandomNormal(0.5, 2.0)), 0, 16, 0.5, 2.0, None),
    # A normal truncated at 2 stddev keeps 0.87962566 of its stddev.
    (serialized(keras.initializers.TruncatedNormal(-1.0, 0.5)), 0, 16, -1.0, 0.5 * 0.8796257, 1.0),
    ("glorot_uniform", 100, 16, 0.0, math.sqrt(2 / 116), math.sqrt(6 / 116)),
    ("glorot_normal", 100, 16, 0.0, math.sqrt(2 / 116), 2 * math.sqrt(2 / 116) / 0.8796257),
    ("he_uniform", 1000, 16, 0.0, math.sqrt(2 / 1000), math.sqrt(6 / 1000)),
    ("he_normal", 1000, 16, 0.0, math.sqrt(2 / 1000), 2 * math.sqrt(2 / 1000) / 0.8796257),
    ("lecun_uniform", 1000, 16, 0.0, math.sqrt(1 / 1000), math.sqrt(3 / 1000)),
    ("lecun_normal", 1000, 16, 0.0, math.sqrt(1 / 1000), 2 * math.sqrt(1 / 1000) / 0.8796257),
    (serialized(keras.initializers.VarianceScaling(2.0, "fan_out", "untruncated_normal")), 1000,
     16, 0.0, math.sqrt(2 / 16), None),
]


@pytest.mark.parametrize("init, input_dim, dim, mean, std, bound", STATISTICS)
def test_values_follow_the_initializers_distribution(init, input_dim, dim, mean, std, bound):
    rows = initial_rows("stats", np.arange(100_000), dim, init, input_dim=input_dim)
    values = rows.astype(np.float64).ravel()
    # 1.6M values: the sample mean is within 5e-3 stddev, the sample stddev within 1%.
    assert abs(values.mean() - mean) < 5e-3 * std
    assert abs(values.std() / std - 1) < 0.01
    if bound is not None:
        assert np.abs(values - mean).max() <= bound * (1 + 1e-6)
        assert np.abs(values - mean).max() > 0.99 * bound


def test_variance_scaling_matches_keras_for_a_bounded_table():
    """Same distribution as Keras would draw for the [input_dim, dim] weight."""
    for name in ("glorot_uniform", "he_uniform", "lecun_normal"):
        ours = initial_rows("t", np.arange(4000), 32, name, input_dim=4000)
        theirs = keras.initializers.get(name)((4000, 32)).numpy()
        assert abs(ours.std() / theirs.std() - 1) < 0.02
        assert abs(np.abs(ours).max() / np.abs(theirs).max() - 1) < 0.05


def test_constants_and_dtype():
    ids = np.array([1, INT64_MAX])
    np.testing.assert_array_equal(initial_rows("t", ids, 3, "zeros"), np.zeros((2, 3)))
    np.testing.assert_array_equal(initial_rows("t", ids, 3, "ones"), np.ones((2, 3)))
    constant = initial_rows("t", ids, 3, INITIALIZERS["constant"], dtype=np.float64)
    assert constant.dtype == np.float64 and (constant == 3.5).all()
    assert initial_rows("t", np.array([], dtype=np.int64), 3, "uniform").shape == (0, 3)


def test_float64_rows_round_to_the_float32_rows():
    ids = np.arange(1000)
    for init in ("uniform", INITIALIZERS["truncated"]):
        wide = initial_rows("t", ids, 5, init, dtype=np.float64)
        narrow = initial_rows("t", ids, 5, init, dtype=np.float32)
        np.testing.assert_array_equal(wide.astype(np.float32), narrow)


def test_fan_based_initializers_need_input_dim():
    with pytest.raises(ModelSpecError, match="GlorotUniform.*input_dim.*fan-free"):
        initial_rows("t", np.arange(3), 4, "glorot_uniform")
    with pytest.raises(ModelSpecError, match="HeNormal"):
        check_initializer(INITIALIZERS["he_normal"])
    check_initializer("glorot_uniform", input_dim=10)
    check_initializer("uniform")


@pytest.mark.parametrize("init, message", [
    ("orthogonal", "Orthogonal is not supported"),
    ("identity", "Identity is not supported"),
    ("no_such_initializer", "cannot rebuild"),
    ({"class_name": "MyInit", "config": {}}, "MyInit"),
    (3, "must be the dict or JSON"),
])
def test_unsupported_initializers_are_named(init, message):
    with pytest.raises(ModelSpecError, match=message) as info:
        check_initializer(init, input_dim=10)
    if "not supported" in message:
        for name in SUPPORTED:
            assert name in str(info.value)
