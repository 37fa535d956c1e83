"""The shard's one-kernel Adam (`ps.fused_adam`) against Keras's own `apply`: the same
variables, slots and step count after every step, and used only where they are the same."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.ps import fused_adam
from elastic_keras.ps.optimizer import OptimizerApplier

RNG = np.random.default_rng(5)
INITIAL = {"kernel": RNG.normal(size=(64, 32)).astype(np.float32),
           "bias": RNG.normal(size=32).astype(np.float32)}
STEPS = [{n: RNG.normal(size=v.shape).astype(np.float32) for n, v in INITIAL.items()}
         for _ in range(6)]


def applier(optimizer):
    variables = {n: tf.Variable(v) for n, v in INITIAL.items()}
    return OptimizerApplier(optimizer, variables), variables


def train(optimizer, lr_scales=(1.0,) * len(STEPS)):
    applying, variables = applier(optimizer)
    for grads, scale in zip(STEPS, lr_scales):
        applying.apply({n: tf.constant(g) for n, g in grads.items()}, lr_scale=scale)
    return applying, variables


@pytest.mark.parametrize("rate", [
    0.01,
    keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5),
])
def test_the_fused_step_leaves_what_keras_apply_leaves(rate, monkeypatch):
    """Variables, both slots and the step count, after 6 steps with a constant or scheduled
    learning rate and staleness scaling of some steps' rates."""
    scales = (1.0, 0.5, 1.0, 0.25, 1.0, 1.0)
    options = dict(beta_1=0.8, beta_2=0.99, epsilon=1e-6)
    traced, kernel_step = [], fused_adam.apply_step
    monkeypatch.setattr(fused_adam, "apply_step", lambda *args: traced.append(
        kernel_step(*args)))
    fused, fused_variables = train(keras.optimizers.Adam(rate, **options), scales)
    assert traced  # the update was traced through the kernel
    monkeypatch.setattr(fused_adam, "fusable", lambda optimizer, variables: False)
    keras_way, keras_variables = train(keras.optimizers.Adam(rate, **options), scales)
    for name in INITIAL:
        np.testing.assert_allclose(fused_variables[name].numpy(),
                                   keras_variables[name].numpy(), rtol=1e-6, atol=1e-7)
    fused_state, keras_state = fused.state(), keras_way.state()
    assert fused_state[0] == keras_state[0] == len(STEPS)
    for name, slots in keras_state[1].items():
        assert set(slots) == {"momentum", "velocity"}
        for slot, value in slots.items():
            np.testing.assert_allclose(fused_state[1][name][slot], value, rtol=1e-6, atol=1e-7)
    assert not np.allclose(fused_variables["kernel"].numpy(), INITIAL["kernel"])


@pytest.mark.parametrize("optimizer", [
    keras.optimizers.Adam(0.01),
    keras.optimizers.Adam(0.01, amsgrad=True),
    keras.optimizers.Adam(0.01, weight_decay=0.1),
    keras.optimizers.Adam(0.01, use_ema=True),
    keras.optimizers.Adam(0.01, clipvalue=0.5),
    keras.optimizers.AdamW(0.01),
])
def test_only_a_plain_adam_is_fused(optimizer):
    variables = [tf.Variable(v) for v in INITIAL.values()]
    plain = type(optimizer) is keras.optimizers.Adam and not (
        optimizer.amsgrad or optimizer.weight_decay or optimizer.use_ema
        or optimizer.clipvalue)
    assert fused_adam.fusable(optimizer, variables) == plain
    constrained = tf.Variable(INITIAL["bias"], constraint=lambda v: tf.maximum(v, 0.0))
    assert not fused_adam.fusable(optimizer, variables + [constrained])


def test_rows_and_the_cases_it_does_not_cover_go_through_keras(monkeypatch):
    """A push of rows (`tf.IndexedSlices`) and an Adam with amsgrad are applied by Keras's
    `apply`, and the fused kernel is never run for them."""
    ran = []
    monkeypatch.setattr(fused_adam, "apply_step", lambda *args: ran.append(args))
    applying, variables = applier(keras.optimizers.Adam(0.01))
    rows = tf.IndexedSlices(tf.ones([2, 32]), tf.constant([1, 3], tf.int64),
                            tf.constant([64, 32], tf.int64))
    applying.apply({"kernel": rows})
    assert not ran and not np.array_equal(variables["kernel"].numpy()[1], INITIAL["kernel"][1])
    np.testing.assert_array_equal(variables["kernel"].numpy()[0], INITIAL["kernel"][0])
    amsgrad, _ = train(keras.optimizers.Adam(0.01, amsgrad=True))
    assert not ran and amsgrad.state()[0] == len(STEPS)
