"""A minibatch is applied at most once on every shard, also when one shard refuses its push
as stale and another accepts it; non-trainable state moves once per minibatch. Real shards
on 127.0.0.1, a real PSClient and Trainer."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common import partition, rpc
from elastic_keras.common.errors import PushRefused
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.worker.trainer import Trainer


class Counter(keras.layers.Layer):
    def build(self, input_shape):
        self.count = self.add_weight(shape=(), initializer="zeros", dtype="int64",
                                     trainable=False, name="count")

    def call(self, inputs, training=None):
        if training:
            self.count.assign_add(1)
        return inputs


def custom_model():
    inputs = keras.Input((4,), name="x")
    x = Counter(name="counter")(inputs)
    x = keras.layers.Dense(3, name="a")(x)
    x = keras.layers.Dense(3, name="b")(x)
    return keras.Model(inputs, keras.layers.Dense(1, name="c")(x))


SPEC = ModelSpec("once", custom_model, keras.losses.mean_squared_error,
                 lambda: keras.optimizers.SGD(0.1), lambda dataset, mode, metadata: dataset)


def _serve(parameters, port=0):
    servicer = PServerServicer(parameters)
    return rpc.create_server([lambda s: add_to_server(servicer, s)], "127.0.0.1", port)


@pytest.fixture
def shards():
    """Two asynchronous shards that refuse pushes staler than one version."""
    parameters = [Parameters(UpdatePolicy(max_staleness=1)) for _ in range(2)]
    servers, addresses = [], []
    for p in parameters:
        server, port = _serve(p)
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    yield parameters, addresses, servers
    for server in servers:
        server.stop(0)


class _Interloper(PSClient):
    """Before this worker's first push lands, another worker pushes twice to shard 1, so
    that shard refuses the push as stale while shard 0 accepts it."""

    def __init__(self, addresses, pushes_before=2):
        super().__init__(addresses)
        self._pushes_before = pushes_before

    def push_gradients(self, worker_id, sequence, versions, gradients, *args, **kwargs):
        if self._pushes_before:
            on_1 = {n: np.zeros_like(g) for n, g in gradients.items()
                    if partition.dense_shard(n, 2) == 1}
            for i in range(self._pushes_before):
                super().push_gradients(9, i + 1, [0, 0], on_1, shards=[1])
            self._pushes_before = 0
        return super().push_gradients(worker_id, sequence, versions, gradients, *args,
                                      **kwargs)


def _batch(rng):
    return (tf.constant(rng.normal(size=(8, 4)), tf.float32),
            tf.constant(rng.normal(size=(8, 1)), tf.float32))


def test_a_push_refused_by_one_shard_is_resent_to_that_shard_alone(shards):
    parameters, addresses, _ = shards
    names = [v.path for v in custom_model().weights]
    assert {partition.dense_shard(n, 2) for n in names} == {0, 1}  # both shards hold some
    client = _Interloper(addresses)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, max_stale_retries=2)
        rng = np.random.default_rng(0)
        for _ in range(3):
            trainer.train_minibatch(*_batch(rng))
    finally:
        client.close()
    assert trainer.stale_pushes == 1
    # Three minibatches: each applied once on each shard (today's code applied the first
    # twice on shard 0, once for each try).
    assert parameters[0].applied_pushes == {0: 3}
    assert parameters[1].applied_pushes == {0: 3, 9: 2}
    assert [p.version for p in parameters] == [3, 5]
    reader = PSClient(addresses)
    try:
        _, _, values = reader.pull_dense()
    finally:
        reader.close()
    assert values["counter/count"] == 3  # one delta per minibatch, none lost or repeated


def test_a_minibatch_given_up_on_names_the_shards_that_never_applied_it(shards):
    parameters, addresses, _ = shards
    client = _Interloper(addresses, pushes_before=2)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, max_stale_retries=0)
        with pytest.raises(PushRefused) as info:
            trainer.train_minibatch(*_batch(np.random.default_rng(1)))
    finally:
        client.close()
    assert info.value.dropped == {1: "stale"}
    assert parameters[0].applied_pushes == {0: 1}
    assert parameters[1].applied_pushes == {9: 2}


def test_overlapped_pushes_refused_by_a_restarted_shard_are_recomputed_for_it(shards):
    """A shard that restarts from a snapshot refuses pushes computed against its earlier run;
    an overlapping worker resends those minibatches to it alone, recomputed."""
    parameters, addresses, servers = shards
    client = PSClient(addresses)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, overlap=True)
        rng = np.random.default_rng(2)
        for _ in range(3):
            trainer.train_minibatch(*_batch(rng))
        trainer.flush()
        # Shard 1 restarts at its address: a new run of it, restored from a snapshot.
        restarted = Parameters(UpdatePolicy(), min_version=parameters[1].version)
        restarted.restore(parameters[1].snapshot())
        servers[1].stop(0).wait()
        servers[1], _ = _serve(restarted, int(addresses[1].rsplit(":", 1)[1]))
        landed = []
        for step in range(4):
            trainer.train_minibatch(*_batch(rng))
            trainer.after_landed(lambda k=step: landed.append(k))
        trainer.flush()
    finally:
        client.close()
    assert landed == [0, 1, 2, 3]
    assert trainer.stale_pushes >= 1
    assert parameters[0].applied_pushes == {0: 7}
    assert restarted.applied_pushes == {0: 7}  # 3 restored, 4 after: none lost or repeated
    assert restarted.version >= parameters[1].version


def test_a_relaunched_worker_numbers_its_minibatches_above_its_predecessors(shards):
    """Whatever its clock says: a predecessor's higher sequences would make every push of
    the new worker a "duplicate", silently dropped."""
    parameters, addresses, _ = shards
    client = PSClient(addresses)
    try:
        first = Trainer(SPEC, client, worker_id=3)
        first.train_minibatch(*_batch(np.random.default_rng(4)))
        relaunched = Trainer(SPEC, client, worker_id=3)
        relaunched._sequence = 1  # a clock far behind the predecessor's
        relaunched.train_minibatch(*_batch(np.random.default_rng(5)))
    finally:
        client.close()
    assert [p.applied_pushes for p in parameters] == [{3: 2}, {3: 2}]
