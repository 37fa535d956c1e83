"""Each sparse optimizer against Keras itself and against hand-written per-row updates."""

import json

import keras
import numpy as np
import pytest

from elastic_keras.common.errors import PayloadError
from elastic_keras.ps.embedding_table import EmbeddingTable
from elastic_keras.ps.sparse_optimizers import Adam, SparseOptimizer, from_keras_config

optimizers = keras.optimizers
schedules = keras.optimizers.schedules

KERAS_OPTIMIZERS = {
    "sgd": lambda: optimizers.SGD(0.1),
    "sgd_momentum": lambda: optimizers.SGD(0.1, momentum=0.9),
    "sgd_nesterov": lambda: optimizers.SGD(0.05, momentum=0.8, nesterov=True),
    "adam": lambda: optimizers.Adam(0.01),
    "adam_tuned": lambda: optimizers.Adam(0.02, beta_1=0.5, beta_2=0.9, epsilon=1e-3),
    "adam_amsgrad": lambda: optimizers.Adam(0.01, amsgrad=True),
    "adagrad": lambda: optimizers.Adagrad(0.1, initial_accumulator_value=0.3, epsilon=1e-4),
    "rmsprop": lambda: optimizers.RMSprop(0.01),
    "rmsprop_momentum_centered": lambda: optimizers.RMSprop(
        0.01, rho=0.8, momentum=0.5, epsilon=1e-5, centered=True),
    "ftrl": lambda: optimizers.Ftrl(0.1),
    "ftrl_regularized": lambda: optimizers.Ftrl(
        0.1, learning_rate_power=-0.3, initial_accumulator_value=0.2,
        l1_regularization_strength=0.01, l2_regularization_strength=0.02,
        l2_shrinkage_regularization_strength=0.03, beta=0.1),
    "adam_exponential_decay": lambda: optimizers.Adam(
        schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)),
    "sgd_piecewise": lambda: optimizers.SGD(
        schedules.PiecewiseConstantDecay([2, 4], [0.3, 0.1, 0.01]), momentum=0.5),
}


def config_of(keras_optimizer):
    return json.dumps(keras.optimizers.serialize(keras_optimizer))


@pytest.mark.parametrize("name", sorted(KERAS_OPTIMIZERS))
def test_touched_rows_match_keras_on_a_variable_of_those_rows(name):
    """A Keras optimizer on a dense variable holding only the touched rows, every row
    touched each step, is the reference: there lazy and dense updates coincide."""
    rng = np.random.default_rng(7)
    dim, steps = 6, 7
    table = table_for(from_keras_config(config_of(KERAS_OPTIMIZERS[name]())), dim)
    sparse = from_keras_config(config_of(KERAS_OPTIMIZERS[name]()))
    ids = np.array([5, -3, 2**62, 0, 17])
    variable = keras.Variable(table.rows(ids))
    reference = KERAS_OPTIMIZERS[name]()
    for step in range(1, steps + 1):
        grads = rng.normal(size=(len(ids), dim)).astype(np.float32)
        reference.apply([grads], [variable])
        order = rng.permutation(len(ids))  # the table must not care about the order
        table.apply(ids[order], grads[order], sparse, step)
    np.testing.assert_allclose(table.rows(ids), variable.numpy(), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam", "rmsprop", "ftrl_regularized"])
def test_repeated_ids_count_as_one_row_with_the_summed_gradient(name):
    rng = np.random.default_rng(3)
    ids = np.array([4, 9, 4, 4, 9, 1])
    grads = rng.normal(size=(len(ids), 3)).astype(np.float32)
    repeated = table_for(from_keras_config(config_of(KERAS_OPTIMIZERS[name]())), 3)
    summed = table_for(from_keras_config(config_of(KERAS_OPTIMIZERS[name]())), 3)
    optimizer = from_keras_config(config_of(KERAS_OPTIMIZERS[name]()))
    for step in (1, 2):
        repeated.apply(ids, grads, optimizer, step)
        summed.apply(np.array([4, 9, 1]),
                     np.stack([grads[[0, 2, 3]].sum(0), grads[[1, 4]].sum(0), grads[5]]),
                     optimizer, step)
    np.testing.assert_allclose(repeated.rows(np.array([1, 4, 9])),
                               summed.rows(np.array([1, 4, 9])), rtol=1e-6, atol=1e-6)


def test_sgd_momentum_by_hand_on_changing_row_subsets():
    lr, momentum = 0.1, 0.9
    optimizer = from_keras_config(config_of(optimizers.SGD(lr, momentum=momentum)))
    subsets = [[0, 1, 2], [1], [3, 0], [2, 3, 1], [0]]
    table, expected, grads = run_subsets(optimizer, subsets)
    velocity = {i: np.zeros(4) for i in range(4)}
    for step, subset in enumerate(subsets):
        for i in subset:
            velocity[i] = momentum * velocity[i] - lr * grads[step][i]
            expected[i] = expected[i] + velocity[i]
    check_rows(table, expected, subsets)


def test_adam_by_hand_on_changing_row_subsets():
    lr, beta_1, beta_2, epsilon = 0.01, 0.9, 0.999, 1e-7
    optimizer = from_keras_config(config_of(optimizers.Adam(lr)))
    subsets = [[0, 1, 2], [1], [3, 0], [2, 3, 1], [0], [3]]
    table, expected, grads = run_subsets(optimizer, subsets)
    m = {i: np.zeros(4) for i in range(4)}
    v = {i: np.zeros(4) for i in range(4)}
    for step, subset in enumerate(subsets, 1):
        # Lazy Adam: the bias correction uses the global step, even for a row's first update.
        alpha = lr * np.sqrt(1 - beta_2**step) / (1 - beta_1**step)
        for i in subset:
            g = grads[step - 1][i]
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            expected[i] = expected[i] - alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    check_rows(table, expected, subsets)


def run_subsets(optimizer, subsets):
    """Applies one step per subset of rows 0..3, and returns the initial rows and gradients."""
    rng = np.random.default_rng(11)
    table = table_for(optimizer, 4)
    ids = np.arange(4)
    expected = {i: row.astype(np.float64) for i, row in enumerate(table.rows(ids))}
    grads = [rng.normal(size=(4, 4)).astype(np.float32) for _ in subsets]
    for step, subset in enumerate(subsets, 1):
        before = table.state()
        table.apply(np.array(subset), grads[step - 1][subset], optimizer, step)
        after = table.state()
        untouched = [i for i in range(4) if i not in subset]
        np.testing.assert_array_equal(after.values[untouched], before.values[untouched])
        for name in optimizer.slot_names:
            np.testing.assert_array_equal(after.slots[name][untouched],
                                          before.slots[name][untouched])
    return table, expected, grads


def check_rows(table, expected, subsets):
    assert set().union(*subsets) == set(expected)
    np.testing.assert_allclose(table.rows(np.arange(4)), np.stack([expected[i] for i in range(4)]),
                               rtol=1e-6, atol=1e-6)


def table_for(optimizer, dim):
    return EmbeddingTable(
        "table", dim, keras.initializers.serialize(keras.initializers.RandomNormal(stddev=0.5)),
        slot_names=optimizer.slot_names,
        slot_initial_values={n: optimizer.slot_initial_value(n) for n in optimizer.slot_names})


def test_slots_and_their_initial_values_follow_keras():
    cases = {
        optimizers.SGD(0.1): {},
        optimizers.SGD(0.1, momentum=0.9): {"momentum": 0.0},
        optimizers.Adam(): {"momentum": 0.0, "velocity": 0.0},
        optimizers.Adam(amsgrad=True): {"momentum": 0.0, "velocity": 0.0, "velocity_hat": 0.0},
        optimizers.Adagrad(initial_accumulator_value=0.25): {"accumulator": 0.25},
        optimizers.RMSprop(momentum=0.1, centered=True):
            {"velocity": 0.0, "momentum": 0.0, "average_gradient": 0.0},
        optimizers.Ftrl(initial_accumulator_value=0.5): {"accumulator": 0.5, "linear": 0.0},
    }
    for keras_optimizer, slots in cases.items():
        optimizer = from_keras_config(keras.optimizers.serialize(keras_optimizer))
        assert isinstance(optimizer, SparseOptimizer)
        assert {n: optimizer.slot_initial_value(n) for n in optimizer.slot_names} == slots
    with pytest.raises(ValueError, match="slots"):
        optimizer.slot_initial_value("nope")


def test_schedules_are_evaluated_at_step_minus_one():
    decay = schedules.ExponentialDecay(1.0, decay_steps=1, decay_rate=0.5)
    optimizer = SparseOptimizer.from_keras_config(config_of(optimizers.SGD(decay)))
    assert [optimizer.learning_rate(step) for step in (1, 2, 3, 2)] == [1.0, 0.5, 0.25, 0.5]
    assert from_keras_config(config_of(optimizers.SGD(0.1))).learning_rate(5) == float(
        np.float32(0.1))


def test_the_gradients_given_are_left_unchanged():
    for name in sorted(KERAS_OPTIMIZERS):
        optimizer = from_keras_config(config_of(KERAS_OPTIMIZERS[name]()))
        grads = np.full((2, 3), 0.5, np.float32)
        slots = {n: np.full((2, 3), optimizer.slot_initial_value(n), np.float32)
                 for n in optimizer.slot_names}
        optimizer.apply(np.ones((2, 3), np.float32), slots, grads, step=1)
        assert (grads == 0.5).all(), name


@pytest.mark.parametrize("keras_optimizer, message", [
    (optimizers.AdamW(), "optimizers SGD, Adam, Adagrad, RMSprop, Ftrl. Received: AdamW"),
    (optimizers.Lion(), "Received: Lion"),
    (optimizers.SGD(weight_decay=0.01), "SGD: option weight_decay"),
    (optimizers.Adam(clipnorm=1.0), "Adam: option clipnorm"),
    (optimizers.Adagrad(clipvalue=1.0), "Adagrad: option clipvalue"),
    (optimizers.RMSprop(global_clipnorm=1.0), "RMSprop: option global_clipnorm"),
    (optimizers.Ftrl(use_ema=True), "Ftrl: option use_ema"),
    (optimizers.Adam(gradient_accumulation_steps=2), "Adam: option gradient_accumulation_steps"),
])
def test_unsupported_optimizers_and_options_are_refused(keras_optimizer, message):
    with pytest.raises(PayloadError, match=message):
        from_keras_config(keras.optimizers.serialize(keras_optimizer))


def test_malformed_configs_are_refused():
    with pytest.raises(PayloadError, match="not valid JSON"):
        from_keras_config("{nope")
    with pytest.raises(PayloadError, match="cannot rebuild"):
        from_keras_config({"class_name": "Adam", "config": {"no_such_option": 1}})
    with pytest.raises(ValueError, match="step"):
        Adam().apply(np.zeros((1, 1)), {}, np.zeros((1, 1)), step=0)
