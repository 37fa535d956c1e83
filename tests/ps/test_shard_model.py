"""`ps.shard_model`: building a shard's model from InitModel, restoring and snapshotting it,
checking pushes against it and applying them."""

import dataclasses
import json

import keras
import numpy as np
import pytest

from elastic_keras.common.errors import CheckpointError, PayloadError
from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps.shard_model import build_model, restore_model, take_snapshot, with_options
from elastic_keras.ps.shard_types import TableConfig, VariableOptions

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
ADAM = json.dumps(keras.optimizers.serialize(keras.optimizers.Adam(0.1)))
VALUES = [("w", np.array([1.0, 2.0], np.float32)), ("mean", np.zeros(2, np.float32))]
TABLE = TableConfig("emb", 3, input_dim=100, initializer="zeros")


def rows(ids, width=3):
    return Slices(np.ones((len(ids), width), np.float32), np.asarray(ids, np.int64), (0, width))


def test_a_model_holds_variables_specs_options_and_empty_tables():
    options = [VariableOptions("mean", trainable=False),
               VariableOptions("w", constraint=json.dumps(
                   keras.constraints.serialize(keras.constraints.NonNeg())))]
    model = build_model(VALUES, ADAM, [TABLE], options)
    assert sorted(model.variables) == ["mean", "w"]
    assert model.specs["w"].trainable and not model.specs["mean"].trainable
    assert model.variables["w"].constraint is not None
    assert set(model.variable_options) == {"mean", "w"}
    assert model.tables["emb"].num_rows == 0 and model.table_configs == (TABLE,)
    assert model.sparse_optimizer.slot_names == ("momentum", "velocity")


@pytest.mark.parametrize("tables, options, problem", [
    ([TableConfig("w", 3)], (), "unlike any dense variable"),
    ([TableConfig("", 3)], (), "unlike any dense variable"),
    ([TableConfig("e", 0)], (), "dim must be >= 1"),
    ([TableConfig("e", 3, input_dim=-1)], (), "input_dim >= 0"),
    ([TableConfig("e", 3, dtype="int32")], (), "floating point"),
    ([TableConfig("e", 3, initializer="no_such_initializer")], (), "Embedding table 'e'"),
    ([TableConfig("e", 3), TableConfig("e", 2)], (), "must be unique"),
    ((), [VariableOptions("nope")], "at most once"),
    ((), [VariableOptions("w"), VariableOptions("w")], "at most once"),
    ((), [VariableOptions("w", constraint="{")], "built-in Keras constraint"),
])
def test_a_bad_table_config_or_option_is_refused_by_name(tables, options, problem):
    with pytest.raises(PayloadError, match=problem) as info:
        build_model(VALUES, SGD, tables, options)
    assert "Received:" in str(info.value)


def test_a_snapshot_restores_to_an_equal_model():
    model = build_model(VALUES, ADAM, [TABLE])
    update, table_rows = model.prepare([("w", np.ones(2, np.float32)), ("emb", rows([4, 7]))],
                                       [])
    model.apply(update.gradients, table_rows, update.deltas, step=1)
    snapshot = take_snapshot(model, 9, {0: 3}, {0: 2}, 1)
    assert (snapshot.version, snapshot.applied_sequences, snapshot.table_steps) == (9, {0: 3}, 1)
    restored = restore_model(snapshot)
    again = take_snapshot(restored, 9, {0: 3}, {0: 2}, 1)
    for name, value in snapshot.dense.items():
        np.testing.assert_array_equal(again.dense[name], value)
    assert again.optimizer_iterations == snapshot.optimizer_iterations == 1
    np.testing.assert_array_equal(again.table_states["emb"].values,
                                  snapshot.table_states["emb"].values)
    assert sorted(again.table_states["emb"].ids) == [4, 7]


@pytest.mark.parametrize("damage, problem", [
    (lambda s: dataclasses.replace(s, table_states={}), "table states must be those"),
    (lambda s: dataclasses.replace(s, table_states={"emb": s.table_states["emb"]._replace(
        slots={})}), "needs the optimizer slots"),
    (lambda s: dataclasses.replace(s, table_states={"emb": s.table_states["emb"]._replace(
        values=np.zeros((2, 5), np.float32))}), "of width 3"),
    (lambda s: dataclasses.replace(s, optimizer_config="{"), "optimizer_config"),
])
def test_an_inconsistent_snapshot_is_a_checkpoint_error(damage, problem):
    model = build_model(VALUES, ADAM, [TABLE])
    model.tables["emb"].rows(np.array([1, 2]))
    snapshot = damage(take_snapshot(model, 1, {}, {}, 0))
    with pytest.raises(CheckpointError, match=problem):
        restore_model(snapshot)


def test_options_given_later_keep_values_tables_and_optimizer_state():
    model = build_model(VALUES, ADAM, [TABLE])
    update, table_rows = model.prepare([("w", np.ones(2, np.float32)),
                                        ("mean", np.ones(2, np.float32))], [])
    model.apply(update.gradients, table_rows, update.deltas, step=1)
    options = build_model(VALUES, ADAM, (), [VariableOptions("mean", trainable=False)])
    rebuilt = with_options(model, options.variable_options)
    assert not rebuilt.specs["mean"].trainable and rebuilt.tables is model.tables
    np.testing.assert_array_equal(rebuilt.variables["w"].numpy(), model.variables["w"].numpy())
    iterations, slots, _ = rebuilt.applier.state()
    assert iterations == 1 and set(slots) == {"w"}


def test_a_push_is_checked_and_split_into_dense_gradients_and_table_rows():
    model = build_model(VALUES, SGD, [TABLE], [VariableOptions("mean", trainable=False)])
    update, table_rows = model.prepare(
        [("w", np.ones(2, np.float64)), ("emb", rows([5, 5]))],
        [("mean", np.full(2, 0.5, np.float32))])
    assert update.gradients["w"].dtype.name == "float32" and set(update.deltas) == {"mean"}
    ids, grads = table_rows["emb"]
    assert ids.tolist() == [5, 5] and grads.shape == (2, 3)
    model.apply(update.gradients, table_rows, update.deltas, step=1)
    np.testing.assert_allclose(model.variables["w"].numpy(), [0.5, 1.5])
    np.testing.assert_allclose(model.variables["mean"].numpy(), [0.5, 0.5])
    np.testing.assert_allclose(model.tables["emb"].rows(np.array([5]))[0], [-1.0] * 3)


@pytest.mark.parametrize("value, problem", [
    (np.ones((2, 3), np.float32), "must be sparse rows"),
    (rows([1], width=2), r"shape \[n, 3\]"),
    (rows([100]), r"must be in \[0, 100\)"),
])
def test_bad_table_rows_in_a_push_are_refused(value, problem):
    model = build_model(VALUES, SGD, [TABLE])
    with pytest.raises(PayloadError, match=problem):
        model.prepare([("emb", value)], [])


def test_lookups_name_an_unknown_table_and_refuse_bad_ids():
    model = build_model(VALUES, SGD, [TABLE])
    ((table, ids),) = model.lookups([("emb", [3, 1])], "PullEmbedding")
    assert table is model.tables["emb"] and ids.tolist() == [3, 1]
    with pytest.raises(PayloadError, match="no embedding table 'user'; it holds \\['emb'\\]"):
        model.lookups([("user", [1])], "PullEmbedding")
    with pytest.raises(PayloadError, match="PullEmbedding 'emb': ids must be a 1-D integer"):
        model.lookups([("emb", [[1.5]])], "PullEmbedding")
