"""A job trains what Keras `fit` trains (ARCHITECTURE decision 11): one worker, two real
shards on 127.0.0.1, synchronous; the exported model predicts what `fit` on the same
minibatches predicts, for optimizer options, a kernel constraint, EMA and BatchNormalization."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common import rpc
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.master.export import export_saved_model
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.worker.trainer import Trainer

pytestmark = pytest.mark.slow  # a SavedModel export per case

BATCH = 16
STEPS = 6


def custom_model():
    inputs = keras.Input((6,), name="x")
    x = keras.layers.Dense(8, activation="tanh", name="hidden",
                           kernel_constraint=keras.constraints.NonNeg())(inputs)
    x = keras.layers.BatchNormalization(name="bn")(x)
    return keras.Model(inputs, keras.layers.Dense(2, name="out")(x), name="mlp")


def loss(labels, predictions):
    return tf.reduce_mean(keras.losses.mean_squared_error(labels, predictions))


def adamw_without_biases():
    optimizer = keras.optimizers.AdamW(0.02, weight_decay=0.3)
    optimizer.exclude_from_weight_decay(var_names=["bias", "gamma", "beta"])
    return optimizer


OPTIMIZERS = {
    "sgd": lambda: keras.optimizers.SGD(0.1),
    "adam": lambda: keras.optimizers.Adam(0.02),
    "adamw excluding biases": adamw_without_biases,
    "global_clipnorm": lambda: keras.optimizers.SGD(0.2, global_clipnorm=0.05),
    "clipnorm": lambda: keras.optimizers.SGD(0.2, clipnorm=0.05),
    "loss_scale_factor": lambda: keras.optimizers.SGD(0.1, loss_scale_factor=8.0),
    "ema": lambda: keras.optimizers.Adam(0.02, use_ema=True, ema_momentum=0.5),
    "ema overwrite": lambda: keras.optimizers.SGD(0.1, use_ema=True, ema_momentum=0.5,
                                                  ema_overwrite_frequency=4),
    "gradient accumulation": lambda: keras.optimizers.SGD(0.1, gradient_accumulation_steps=2,
                                                          clipvalue=0.02),
    "lamb": lambda: keras.optimizers.Lamb(0.02),
}


@pytest.fixture
def shards():
    servers, addresses = [], []
    for _ in range(2):
        servicer = PServerServicer(Parameters(UpdatePolicy(grads_to_wait=1)))
        server, port = rpc.create_server([lambda s, sv=servicer: add_to_server(sv, s)])
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")
    yield addresses
    for server in servers:
        server.stop(0)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_the_export_predicts_what_fit_predicts(shards, tmp_path, name):
    spec = ModelSpec("equivalence", custom_model, loss, OPTIMIZERS[name],
                     lambda dataset, mode, metadata: dataset)
    rng = np.random.default_rng(3)
    x = rng.normal(size=(BATCH * STEPS, 6)).astype(np.float32)
    y = rng.normal(size=(BATCH * STEPS, 2)).astype(np.float32)
    client = PSClient(shards)
    try:
        trainer = Trainer(spec, client, worker_id=0, strategy="sync")
        trainer._ensure_model(tf.constant(x[:1]))  # offers its initial values
        _, _, initial = client.pull_dense()
        for step in range(STEPS):
            part = slice(step * BATCH, (step + 1) * BATCH)
            trainer.train_minibatch(tf.constant(x[part]), tf.constant(y[part]))
        # Keras, from the same initial values.
        reference = custom_model()
        reference(x[:1])
        for variable in reference.weights:
            variable.assign(initial[variable.path])
        reference.compile(optimizer=OPTIMIZERS[name](), loss=keras.losses.MeanSquaredError())
        reference.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0)

        export_saved_model(spec, client, tf.constant(x[:2]), str(tmp_path / "export"), 10**9)
    finally:
        client.close()
    served = tf.saved_model.load(str(tmp_path / "export"))
    probe = rng.normal(size=(32, 6)).astype(np.float32)
    np.testing.assert_allclose(served.serve(tf.constant(probe)).numpy(),
                               reference.predict(probe, verbose=0), rtol=1e-4, atol=1e-4)
