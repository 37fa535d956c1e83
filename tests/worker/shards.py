"""Real parameter-server shards on 127.0.0.1 for the worker's tests, a small model that
counts its training steps (a non-trainable delta per minibatch), and a client through which
another worker gets in first."""

import contextlib

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common import partition, rpc
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server


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


def mean_squared_error(labels, predictions):
    return tf.reduce_mean(keras.losses.mean_squared_error(labels, predictions))


SPEC = ModelSpec("once", custom_model, mean_squared_error,
                 lambda: keras.optimizers.SGD(0.1), lambda dataset, mode, metadata: dataset)


def batch(rng):
    """A minibatch of 8 random examples for `custom_model`."""
    return (tf.constant(rng.normal(size=(8, 4)), tf.float32),
            tf.constant(rng.normal(size=(8, 1)), tf.float32))


def serve(parameters, port=0):
    """A started gRPC server of shard `parameters` on 127.0.0.1; returns (server, port)."""
    servicer = PServerServicer(parameters)
    return rpc.create_server([lambda s: add_to_server(servicer, s)], "127.0.0.1", port)


@contextlib.contextmanager
def two_shards():
    """Two asynchronous shards that refuse pushes staler than one version, served on
    127.0.0.1: yields (their `Parameters`, addresses, servers); stops the servers after."""
    parameters = [Parameters(UpdatePolicy(max_staleness=1)) for _ in range(2)]
    servers, addresses = [], []
    try:
        for p in parameters:
            server, port = serve(p)
            servers.append(server)
            addresses.append(f"127.0.0.1:{port}")
        yield parameters, addresses, servers
    finally:
        for server in servers:
            server.stop(0)


def counted(addresses):
    """The counter's value on the shards at `addresses`."""
    reader = PSClient(addresses)
    try:
        _, _, values = reader.pull_dense()
    finally:
        reader.close()
    return values["counter/count"]


class Interloper(PSClient):
    """Before this worker's first push lands, worker 9 pushes twice to shard 1 of two, so
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
