"""A worker rides through a parameter server that dies and comes back.

The shard is a real gRPC server on 127.0.0.1. It is stopped in the middle of a step and a new
one is started on the same port, with the same state (a shard restored from a checkpoint) or
empty (no checkpoint), or on another port, which the worker learns (from the master's
heartbeat answers, here told directly). The trainer retries until it answers.
"""

import threading
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common import rpc
from elastic_keras.common.errors import PSError
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.worker import trainer as trainer_module
from elastic_keras.worker.trainer import Trainer


def _spec():
    def model():
        inputs = keras.Input(shape=(3,), name="x")
        return keras.Model(inputs, keras.layers.Dense(1, name="out")(inputs))

    return ModelSpec(
        module_name="test_ps_outage", custom_model=model,
        loss=lambda labels, predictions: tf.reduce_mean(tf.square(predictions - labels)),
        optimizer=lambda: keras.optimizers.SGD(learning_rate=0.1),
        dataset_fn=lambda dataset, mode, metadata: dataset,
    )


def _serve(parameters, port=0):
    servicer = PServerServicer(parameters)
    return rpc.create_server(
        [lambda s: add_to_server(servicer, s)], port=port)


class DyingParameters(Parameters):
    """A shard that applies its first push, then its server dies before answering."""

    def __init__(self):
        super().__init__()
        self.server = None
        self.died = threading.Event()

    def push(self, push):
        result = super().push(push)
        if not self.died.is_set():
            self.died.set()
            self.server.stop(0)
            time.sleep(0.5)
        return result


BATCH = (tf.constant([[1.0, 2.0, 3.0]]), tf.constant([[1.0]]))


def test_a_push_applied_before_the_shard_died_is_not_applied_twice(monkeypatch):
    monkeypatch.setattr(trainer_module, "_RETRY_PAUSE_S", 0.1)
    parameters = DyingParameters()
    parameters.server, port = _serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=10)
    trainer = Trainer(_spec(), client, worker_id=0)
    revived = []
    threading.Thread(target=lambda: (parameters.died.wait(),
                                     revived.append(_serve(parameters, port)[0]))).start()
    try:
        trainer.train_minibatch(*BATCH)
        # The shard applied the push once; the retry, with the same sequence, was a duplicate.
        assert parameters.version == 1
        trainer.train_minibatch(*BATCH)
        assert parameters.version == 2
    finally:
        client.close()
        for server in revived:
            server.stop(0)


def test_a_shard_back_without_a_checkpoint_gets_the_workers_copy(monkeypatch):
    monkeypatch.setattr(trainer_module, "_RETRY_PAUSE_S", 0.1)
    first = Parameters()
    server, port = _serve(first)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=10)
    trainer = Trainer(_spec(), client, worker_id=0)
    revived = []
    try:
        trainer.train_minibatch(*BATCH)
        server.stop(0)
        # What the worker holds: the shard's values after its push, which came back with it.
        held = first.pull().dense
        empty = Parameters()
        timer = threading.Timer(1.0, lambda: revived.append(_serve(empty, port)[0]))
        timer.start()
        trainer.train_minibatch(*BATCH)  # waits for the shard, offers it its values, trains
        timer.join()
        assert empty.initialized and empty.version == 1
        # The new shard started from the worker's copy and applied this one step to it:
        # y = x.w + b, loss = (y - 1)^2, SGD with learning rate 0.1.
        x = BATCH[0].numpy()[0]
        w, b = held["out/kernel"][:, 0], held["out/bias"]
        error = 2 * (x @ w + b[0] - 1.0)
        now = empty.pull().dense
        # float32 on both sides: an element near zero needs an absolute tolerance too
        close = {"rtol": 1e-5, "atol": 1e-6}
        np.testing.assert_allclose(now["out/kernel"][:, 0], w - 0.1 * error * x, **close)
        np.testing.assert_allclose(now["out/bias"], b - 0.1 * error, **close)
    finally:
        client.close()
        for s in revived:
            s.stop(0)


def test_a_shard_that_never_comes_back_fails_the_step_after_the_wait(monkeypatch):
    monkeypatch.setattr(trainer_module, "_RETRY_PAUSE_S", 0.1)
    monkeypatch.setattr(trainer_module, "PS_RECOVERY_S", 1.0)
    parameters = Parameters()
    server, port = _serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=2)
    trainer = Trainer(_spec(), client, worker_id=0)
    try:
        trainer.train_minibatch(*BATCH)
        server.stop(0)
        # Its next pull came with its push: the step's first call to fail is its push.
        with pytest.raises(PSError, match="A parameter server failed a push for"):
            trainer.train_minibatch(*BATCH)
    finally:
        client.close()


def test_a_shard_back_at_another_address_is_called_there(monkeypatch):
    monkeypatch.setattr(trainer_module, "_RETRY_PAUSE_S", 0.1)
    parameters = Parameters()
    server, port = _serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=10)
    trainer = Trainer(_spec(), client, worker_id=0)
    moved = []

    def relaunch_elsewhere():
        new_server, new_port = _serve(parameters)  # the same state, a new port
        moved.append(new_server)
        client.readdress([f"127.0.0.1:{new_port}"])

    try:
        trainer.train_minibatch(*BATCH)
        server.stop(0)
        timer = threading.Timer(1.0, relaunch_elsewhere)
        timer.start()
        trainer.train_minibatch(*BATCH)  # retries at the old address until told the new one
        timer.join()
        assert parameters.version == 2
        assert client.addresses != [f"127.0.0.1:{port}"]
        with pytest.raises(ValueError, match="all 1 shards. Received: 2 addresses"):
            client.readdress(["127.0.0.1:1", "127.0.0.1:2"])
    finally:
        client.close()
        for s in moved:
            s.stop(0)
