"""The worker's `Trainer` against a real shard served on 127.0.0.1: what travels and changes.

A model with an elastic `Embedding`, a large plain `keras.layers.Embedding` (served from the
PS) and a small plain one (a dense variable) takes one step; the shard then tells what the
worker sent it.
"""

import dataclasses

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common import rpc
from elastic_keras.common.embedding_init import initial_rows
from elastic_keras.common.errors import PayloadError
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.layers import Embedding
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.worker import steps
from elastic_keras.worker.trainer import Trainer

DIM = 4
LARGE_ROWS = 5_000  # 20,000 parameters: above THRESHOLD, so served from the PS
SMALL_ROWS = 10  # 40 parameters: a dense variable
THRESHOLD = 1_000


class CountingParameters(Parameters):
    """A shard that records the ids of every PullEmbedding, per table."""

    def __init__(self):
        super().__init__()
        self.pulled = {}
        self.calls = []  # the tables of each PullEmbedding

    def pull_embeddings(self, ids_by_table, read_only=False):
        ids_by_table = tuple(ids_by_table)
        self.calls.append(sorted(table for table, _ in ids_by_table))
        for table, ids in ids_by_table:
            self.pulled.setdefault(table, []).append(np.array(ids))
        return super().pull_embeddings(ids_by_table, read_only)


def _model():
    users = keras.Input(shape=(3,), dtype="int64", name="users")
    items = keras.Input(shape=(2,), dtype="int64", name="items")
    slot = keras.Input(shape=(1,), dtype="int64", name="slot")
    merged = keras.layers.Concatenate()([
        Embedding(DIM, combiner="sum", table="user")(users),
        keras.layers.Flatten()(keras.layers.Embedding(LARGE_ROWS, DIM, name="large")(items)),
        keras.layers.Flatten()(keras.layers.Embedding(SMALL_ROWS, DIM, name="small")(slot)),
    ])
    return keras.Model({"users": users, "items": items, "slot": slot},
                       keras.layers.Dense(1, name="out")(merged))


def _spec():
    return ModelSpec(
        module_name="test_trainer",
        custom_model=_model,
        loss=lambda labels, predictions: tf.reduce_mean(tf.square(predictions - labels)),
        optimizer=lambda: keras.optimizers.Adam(learning_rate=0.1),
        dataset_fn=lambda dataset, mode, metadata: dataset,
    )


@pytest.fixture
def shard():
    """(the shard's `CountingParameters`, a `PSClient` to it over loopback gRPC)."""
    parameters = CountingParameters()
    servicer = PServerServicer(parameters)
    server, port = rpc.create_server(
        [lambda s: add_to_server(servicer, s)])
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    yield parameters, client
    client.close()
    server.stop(0)


def _table_ids(parameters, table):
    chunks = parameters.table_rows(table, 1 << 16)
    if not chunks:
        return np.zeros(0, np.int64), np.zeros((0, DIM), np.float32)
    return np.concatenate([i for i, _ in chunks]), np.concatenate([r for _, r in chunks])


def test_one_step_moves_only_the_rows_of_the_batch(shard):
    parameters, client = shard
    keras.utils.set_random_seed(0)
    trainer = Trainer(_spec(), client, worker_id=0, embedding_threshold_params=THRESHOLD)
    user_ids = np.array([[7, 7, -(2**62)], [2**40, 7, 3]], np.int64)  # 7 three times
    item_ids = np.array([[11, 4_999], [11, 11]], np.int64)  # 11 three times
    features = {"users": tf.constant(user_ids), "items": tf.constant(item_ids),
                "slot": tf.constant([[1], [2]], tf.int64)}
    loss = trainer.train_minibatch(features, tf.constant([[1.0], [-1.0]]))
    assert np.isfinite(loss)

    # Dense parameters on the PS (what the trainer pulls and pushes): the small plain
    # Embedding and the Dense layer, never the large plain Embedding.
    dense = parameters.pull().dense
    assert any("small" in name and "embeddings" in name for name in dense)
    assert not any("large" in name for name in dense)
    assert sum(v.size for v in dense.values()) == SMALL_ROWS * DIM + (DIM + 2 * DIM + DIM) + 1
    with pytest.raises(PayloadError, match="holds no embedding table 'small'"):
        parameters.table_rows("small", 1)

    # Each distinct id was pulled exactly once, in one request, for its step.
    assert [sorted(ids.tolist()) for ids in parameters.pulled["user"]] == [
        sorted({7, -(2**62), 2**40, 3})]
    assert [sorted(ids.tolist()) for ids in parameters.pulled["large"]] == [[11, 4_999]]

    # The PS created rows for those ids only, and the step moved every one of them.
    config = keras.initializers.serialize(keras.initializers.get("uniform"))
    for table, expected, input_dim in (("user", np.unique(user_ids), 0),
                                       ("large", np.unique(item_ids), LARGE_ROWS)):
        ids, rows = _table_ids(parameters, table)
        order = np.argsort(ids)
        ids, rows = ids[order], rows[order]
        np.testing.assert_array_equal(ids, expected)
        initial = initial_rows(table, ids, DIM, config, input_dim)
        assert np.all(np.any(rows != initial, axis=1)), table


def test_a_second_step_pulls_new_ids_and_reuses_trained_rows(shard):
    parameters, client = shard
    trainer = Trainer(_spec(), client, worker_id=0, embedding_threshold_params=THRESHOLD)
    features = {"users": tf.constant([[1, 2, 3]], tf.int64),
                "items": tf.constant([[5, 6]], tf.int64), "slot": tf.constant([[0]], tf.int64)}
    trainer.train_minibatch(features, tf.constant([[1.0]]))
    before = dict(zip(*_table_ids(parameters, "large")))
    features["items"] = tf.constant([[6, 7]], tf.int64)
    trainer.train_minibatch(features, tf.constant([[1.0]]))
    assert parameters.version == 2
    assert [sorted(ids.tolist()) for ids in parameters.pulled["large"]] == [[5, 6], [6, 7]]
    after = dict(zip(*_table_ids(parameters, "large")))
    assert sorted(after) == [5, 6, 7]
    # Lazy updates: the row of 5, not in the second batch, kept its value (and its slots).
    np.testing.assert_array_equal(after[5], before[5])
    assert np.any(after[6] != before[6])


def _shared_ids_spec():
    """DeepFM's shape: two tables looked up with the same ids."""
    def model():
        ids = keras.Input(shape=(3,), dtype="int64", name="ids")
        linear = Embedding(1, combiner="sum", table="linear")(ids)
        factors = keras.layers.Flatten()(Embedding(DIM, table="factors")(ids))
        out = keras.layers.Dense(1)(keras.layers.Concatenate()([linear, factors]))
        return keras.Model(ids, out)

    return dataclasses.replace(_spec(), custom_model=model)


def test_tables_looked_up_with_the_same_ids_are_pulled_in_one_call(shard):
    parameters, client = shard
    trainer = Trainer(_shared_ids_spec(), client, worker_id=0, strategy="async")
    for batch in ([[1, 2, 2]], [[3, 1, 4]], [[3, 1, 4]]):
        trainer.train_minibatch(tf.constant(batch, tf.int64), tf.constant([[1.0]]))
    # The first step learns that they share ids; each step after pulls both in one call.
    assert sorted(parameters.calls[:2]) == [["factors"], ["linear"]]
    assert parameters.calls[2:] == [["factors", "linear"], ["factors", "linear"]]
    assert [sorted(i.tolist()) for i in parameters.pulled["factors"]] == [[1, 2], [1, 3, 4],
                                                                          [1, 3, 4]]
    assert parameters.version == 3
    for table in ("linear", "factors"):
        assert sorted(_table_ids(parameters, table)[0].tolist()) == [1, 2, 3, 4]


def branching_loss(labels, predictions):
    """Python control flow on a tensor's value, as a module may write it."""
    error = tf.reduce_mean(tf.square(predictions - labels))
    if error > 100.0:
        error = tf.sqrt(error)
    return error


def test_a_loss_that_branches_on_a_tensor_runs_in_the_compiled_step(shard, caplog):
    """The step is traced without AutoGraph, the module's loss with it: its `if` becomes a
    graph conditional, taken per minibatch, and the step is not run eagerly instead."""
    _, client = shard
    trainer = Trainer(dataclasses.replace(_spec(), loss=branching_loss), client, worker_id=0,
                      embedding_threshold_params=THRESHOLD)
    features = {"users": tf.constant([[1, 2, 3]], tf.int64),
                "items": tf.constant([[4, 5]], tf.int64), "slot": tf.constant([[1]], tf.int64)}
    far = trainer.train_minibatch(features, tf.constant([[1e4]]))
    near = trainer.train_minibatch(features, tf.constant([[0.0]]))
    assert 9e3 < far < 1.1e4  # the square root of an error of about 1e8
    assert near < 100.0
    assert "running eagerly" not in caplog.text


def test_a_loss_autograph_cannot_convert_runs_as_written(monkeypatch, caplog):
    def unreadable(fn):
        raise OSError("could not get source code")

    monkeypatch.setattr(tf.autograph, "to_graph", unreadable)
    assert steps.converted(branching_loss) is branching_loss
    assert "branching_loss runs as written" in caplog.text and "source code" in caplog.text


def test_pulled_values_of_unknown_names_or_shapes_are_refused_before_any_is_assigned(shard):
    """`assign` checks every value a shard sent (name and shape) before it assigns one, and
    assigns the rest in one go, cast to the variables' dtypes."""
    from elastic_keras.common.errors import PSError
    from elastic_keras.worker.strategies import Pulled

    parameters, client = shard
    trainer = Trainer(_spec(), client, worker_id=0, embedding_threshold_params=THRESHOLD)
    features = {"users": tf.constant([[1, 2, 3]], tf.int64),
                "items": tf.constant([[4, 5]], tf.int64), "slot": tf.constant([[1]], tf.int64)}
    trainer.train_minibatch(features, tf.constant([[1.0]]))
    trainer.flush()
    variables = {v.path: v for v in trainer._model.variables}
    before = {name: v.numpy().copy() for name, v in variables.items()}
    kernel = next(name for name in variables if name.endswith("out/kernel"))
    bias = next(name for name in variables if name.endswith("out/bias"))
    good = {bias: np.full(before[bias].shape, 5.0, np.float64)}  # cast to float32
    for bad, match in (({"nope": np.zeros(1)}, "unknown variable 'nope'"),
                       ({kernel: np.zeros((1, 1))}, r"shape \[1, 1\]; the model's is")):
        with pytest.raises(PSError, match=match):
            trainer.assign(Pulled(True, [9], {**good, **bad}, [0]))
        for name, variable in variables.items():
            np.testing.assert_array_equal(variable.numpy(), before[name])
    trainer.assign(Pulled(True, [9], good, [0]))
    np.testing.assert_array_equal(variables[bias].numpy(), np.full(before[bias].shape, 5.0))
    assert variables[bias].dtype == "float32" and trainer.model_version == 9
