"""Which Keras optimizers a job takes, what the worker does to gradients, what shards run."""

import json

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.optimizer_contract import (
    GradientPrep, builtin_optimizers, check_optimizer, shard_config,
)
from elastic_keras.ps.optimizer import OptimizerApplier, optimizer_from_config


class MySGD(keras.optimizers.SGD):
    pass


@pytest.mark.parametrize("optimizer, named", [
    (lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)),
     "LossScaleOptimizer"),
    (lambda: MySGD(0.1), "MySGD"),
    (lambda: keras.optimizers.SGD(0.1, global_clipnorm=1.0, gradient_accumulation_steps=2),
     "global_clipnorm"),
])
def test_what_a_job_cannot_train_as_keras_is_refused_by_name(optimizer, named):
    with pytest.raises(ModelSpecError, match=named) as info:
        check_optimizer(optimizer())
    assert "Received:" in str(info.value)


SUPPORTED = sorted(set(builtin_optimizers()) - {"LossScaleOptimizer", "MultiOptimizer"})


@pytest.mark.parametrize("name", SUPPORTED)
def test_every_supported_builtin_optimizer_updates_shard_variables_as_keras(name):
    """The shards run Keras's optimizer on plain tf.Variables, rebuilt from its config."""
    optimizer = builtin_optimizers()[name](learning_rate=0.01)
    check_optimizer(optimizer)
    rng = np.random.default_rng(0)
    initial = {"dense/kernel": rng.normal(size=(4, 3)).astype(np.float32),
               "dense/bias": rng.normal(size=3).astype(np.float32)}
    steps = [{n: rng.normal(size=v.shape).astype(np.float32) for n, v in initial.items()}
             for _ in range(4)]
    keras_variables = {n: keras.Variable(v, name=n.split("/")[1]) for n, v in initial.items()}
    for grads in steps:
        optimizer.apply([tf.constant(grads[n]) for n in keras_variables],
                        list(keras_variables.values()))
    config = shard_config(keras.optimizers.serialize(builtin_optimizers()[name](
        learning_rate=0.01)))
    shard_variables = {n: tf.Variable(v) for n, v in initial.items()}
    applier = OptimizerApplier(optimizer_from_config(config), shard_variables)
    for grads in steps:
        applier.apply({n: tf.constant(g) for n, g in grads.items()})
    for n in initial:
        np.testing.assert_allclose(shard_variables[n].numpy(), keras_variables[n].numpy(),
                                   rtol=1e-5, atol=1e-6)


def test_shards_run_the_config_without_what_the_worker_did():
    sgd = keras.optimizers.SGD(0.1, loss_scale_factor=4.0, global_clipnorm=2.0)
    config = json.loads(shard_config(keras.optimizers.serialize(sgd)))["config"]
    assert config["loss_scale_factor"] is None and config["global_clipnorm"] is None
    assert config["learning_rate"] == pytest.approx(0.1)
    # Accumulated gradients are clipped where they are accumulated: on the shards.
    accumulating = keras.optimizers.SGD(0.1, clipvalue=0.5, gradient_accumulation_steps=3)
    config = json.loads(shard_config(keras.optimizers.serialize(accumulating)))["config"]
    assert config["clipvalue"] == 0.5
    assert shard_config("not json") == "not json"  # left for the caller's check to reject


@pytest.mark.parametrize("options", [
    dict(global_clipnorm=0.7), dict(clipnorm=0.3), dict(clipvalue=0.05),
    dict(loss_scale_factor=8.0, global_clipnorm=0.7),
])
def test_the_worker_unscales_and_clips_as_keras_apply_would(options):
    rng = np.random.default_rng(1)
    dense = {"a": rng.normal(size=(3, 2)).astype(np.float32),
             "b": tf.IndexedSlices(tf.constant(rng.normal(size=(2, 4)), tf.float32),
                                   tf.constant([0, 3], tf.int64), tf.constant([5, 4], tf.int64))}
    rows = {"table": (np.array([7, 9]), rng.normal(size=(2, 4)).astype(np.float32))}
    scale = options.get("loss_scale_factor", 1.0)
    prepared, prepared_rows = GradientPrep.of(keras.optimizers.SGD(1.0, **options)).apply(
        {"a": dense["a"] * scale, "b": tf.IndexedSlices(dense["b"].values * scale,
                                                       dense["b"].indices,
                                                       dense["b"].dense_shape)},
        {"table": (rows["table"][0], rows["table"][1] * scale)},
    )
    # Keras's own clipping of the same tensors (the table's rows as one more variable).
    keras_sgd = keras.optimizers.SGD(1.0, **{k: v for k, v in options.items()
                                             if k != "loss_scale_factor"})
    expected = keras_sgd._clip_gradients([tf.constant(dense["a"]), dense["b"].values,
                                          tf.constant(rows["table"][1])])
    np.testing.assert_allclose(prepared["a"], expected[0], rtol=1e-5)
    np.testing.assert_allclose(prepared["b"].values, expected[1], rtol=1e-5)
    np.testing.assert_array_equal(prepared["b"].indices, [0, 3])
    np.testing.assert_allclose(prepared_rows["table"][1], expected[2], rtol=1e-5)
    np.testing.assert_array_equal(prepared_rows["table"][0], [7, 9])
