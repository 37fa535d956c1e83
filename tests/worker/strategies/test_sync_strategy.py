"""Synchronous rounds: a worker's next pull waits for the rounds its push joined, so
synchronous training is a larger batch: with SGD, 2 workers and --grads-to-wait 2, every
step's parameters (dense and embedding rows) equal one process training on the union of the
two minibatches. Real shards on 127.0.0.1, real PSClient and Trainers, two threads; the
waiting itself against a `FakeReplica`."""

import threading

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common import rpc
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.layers import Embedding
from elastic_keras.layers.lookup_context import (
    LookupContext,
    lookup_context,
    merge_row_gradients,
)
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.worker.strategies import Minibatch
from elastic_keras.worker.strategies.sync import SyncRounds
from elastic_keras.worker.trainer import Trainer
from tests.worker.strategies.fake_replica import FakeReplica, stale

LR = 0.1


def custom_model():
    ids = keras.Input((3,), dtype="int64", name="ids")
    dense = keras.Input((4,), name="x")
    rows = Embedding(4, combiner="sum", table="emb", name="emb")(ids)
    hidden = keras.layers.Dense(5, activation="tanh", name="hidden")(
        keras.layers.Concatenate(name="cat")([rows, dense])
    )
    return keras.Model([ids, dense], keras.layers.Dense(1, name="out")(hidden), name="m")


def loss(labels, predictions):
    return tf.reduce_mean(keras.losses.mean_squared_error(labels, predictions))


SPEC = ModelSpec("sync_test", custom_model, loss, lambda: keras.optimizers.SGD(LR),
                 lambda dataset, mode, metadata: dataset)


def batch(rng, size=8):
    ids = rng.integers(0, 12, size=(size, 3))  # ids repeat across and within batches
    return (tf.constant(ids, tf.int64), tf.constant(rng.normal(size=(size, 4)), tf.float32)), \
        tf.constant(rng.normal(size=(size, 1)), tf.float32)



def test_the_next_pull_waits_for_the_versions_the_rounds_it_joined_make():
    """Shard 0 applied the push at version 3, shard 1 (after a stale refusal) at 5."""
    replica = FakeReplica(answers=[{1: stale(5)}], versions=(3, 3))
    strategy = SyncRounds(replica)
    strategy.train(Minibatch(None, 1.0, 1))
    strategy.train(Minibatch(None, 2.0, 2))
    pulls = [e for e in replica.events if e[0] == "pull"]
    assert pulls == [("pull", None), ("pull", [0, 5]), ("pull", [4, 6])]


def test_two_sync_workers_equal_one_process_on_the_union():
    servers, addresses = [], []
    for _ in range(2):
        servicer = PServerServicer(Parameters(UpdatePolicy(grads_to_wait=2)))
        server, port = rpc.create_server(
            [lambda s, sv=servicer: add_to_server(sv, s)]
        )
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    clients = [PSClient(addresses) for _ in range(3)]
    trainers = [Trainer(SPEC, clients[i], worker_id=i, strategy="sync") for i in range(2)]
    rng = np.random.default_rng(0)
    try:
        steps = [(batch(rng), batch(rng)) for _ in range(4)]
        # Both workers build and offer initial values; the shards keep the first.
        warm = [threading.Thread(target=t._ensure_model, args=(steps[0][i][0],))
                for i, t in enumerate(trainers)]
        for thread in warm:
            thread.start()
        for thread in warm:
            thread.join()
        reference = custom_model()
        reference(steps[0][0][0])
        _, _, values = clients[2].pull_dense()
        for variable in reference.weights:
            variable.assign(values[variable.path])
        table = dict(zip(range(12), clients[2].pull_embeddings({"emb": np.arange(12)})["emb"]))

        for step, (first, second) in enumerate(steps, 1):
            threads = [threading.Thread(target=t.train_minibatch, args=b)
                       for t, b in zip(trainers, (first, second))]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=60)
            _reference_step(reference, table, first, second)

            _, versions, pulled = clients[2].pull_dense()
            assert versions == [step, step]
            for variable in reference.weights:
                np.testing.assert_allclose(pulled[variable.path], variable.numpy(),
                                           rtol=1e-5, atol=1e-7)
            rows = clients[2].pull_embeddings({"emb": np.arange(12)})["emb"]
            np.testing.assert_allclose(rows, np.stack([table[i] for i in range(12)]),
                                       rtol=1e-5, atol=1e-7)
        assert trainers[0].stale_pushes == trainers[1].stale_pushes == 0
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop(0)


def _reference_step(model, table, first, second):
    """One SGD step of one process on the union of both minibatches (mean loss)."""
    (ids_a, x_a), y_a = first
    (ids_b, x_b), y_b = second
    features = (tf.concat([ids_a, ids_b], 0), tf.concat([x_a, x_b], 0))
    labels = tf.concat([y_a, y_b], 0)

    def lookup(name, ids):
        return np.stack([table[int(i)] for i in ids]).astype(np.float32)

    with tf.GradientTape() as tape:
        context = LookupContext(lookup, tape)
        with lookup_context(context):
            value = tf.reduce_mean(loss(labels, model(features, training=True)))
    grads = tape.gradient(value, model.trainable_weights + [r.rows for r in context.records])
    for variable, grad in zip(model.trainable_weights, grads):
        variable.assign_sub(LR * grad)
    rows = merge_row_gradients([(r.table, r.unique_ids.numpy()) for r in context.records],
                               grads[len(model.trainable_weights):])
    for ids, row_grads in rows.values():
        for i, g in zip(ids, row_grads):
            table[int(i)] = table[int(i)] - LR * g
