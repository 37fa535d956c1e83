"""Evaluation metrics added up across tasks (elastic_keras.common.metrics).

Workers each evaluate a few tasks and send their metrics' state variables; the master adds
them up. The result must equal one metric updated on all the data at once.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.metrics import MetricSums, build_metrics, to_states
from elastic_keras.proto import master_pb2

NUM_CLASSES = 4


def absolute_error(labels, predictions):
    """A plain fn(labels, predictions): per-example error of the top class's probability."""
    labels = tf.cast(labels, tf.float32)
    return tf.abs(labels - tf.reduce_max(predictions, axis=-1))


def eval_metrics_fn():
    return {
        "accuracy": keras.metrics.SparseCategoricalAccuracy(),
        "auc": keras.metrics.AUC(num_thresholds=50),
        "precision": keras.metrics.Precision(thresholds=0.4),
        "mean_label": keras.metrics.Mean(),
        "absolute_error": absolute_error,
    }


def _data(num_examples, seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, NUM_CLASSES, size=num_examples)
    logits = rng.normal(size=(num_examples, NUM_CLASSES))
    logits[np.arange(num_examples), labels] += rng.normal(1.0, 1.0, size=num_examples)
    probabilities = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    return labels, probabilities.astype(np.float32)


def _update(metrics, labels, probabilities):
    """Updates each metric with the data in the form it takes."""
    binary_labels = (labels == 0).astype(np.float32)
    scores = probabilities[:, 0]
    metrics["accuracy"].update_state(labels, probabilities)
    metrics["auc"].update_state(binary_labels, scores)
    metrics["precision"].update_state(binary_labels, scores)
    metrics["mean_label"].update_state(labels.astype(np.float32))
    metrics["absolute_error"].update_state(labels, probabilities)


def _over_the_wire(states):
    return [master_pb2.MetricState.FromString(s.SerializeToString()) for s in states]


def _results(metrics):
    return {name: float(metric.result()) for name, metric in metrics.items()}


def test_states_summed_over_tasks_equal_one_metric_over_all_data():
    # Tasks of unequal sizes: averaging their results would not give the overall result.
    tasks = [_data(n, seed) for seed, n in enumerate([7, 130, 41, 300])]
    sums = MetricSums()
    per_task = []
    for labels, probabilities in tasks:
        metrics = build_metrics(eval_metrics_fn)  # a fresh set per task, as in a worker
        _update(metrics, labels, probabilities)
        per_task.append(_results(metrics))
        sums.add(_over_the_wire(to_states(metrics)))

    everything = build_metrics(eval_metrics_fn)
    _update(everything, np.concatenate([t[0] for t in tasks]),
            np.concatenate([t[1] for t in tasks]))
    expected = _results(everything)

    results = sums.results(eval_metrics_fn)
    assert sorted(results) == sorted(expected)
    for name, value in expected.items():
        assert results[name] == pytest.approx(value, rel=1e-6, abs=1e-7), name
        assert isinstance(results[name], float)
    # The data tells the sum of states from a mean of per-task results.
    naive = {name: np.mean([r[name] for r in per_task]) for name in expected}
    assert any(abs(naive[n] - expected[n]) > 1e-3 for n in expected)


def test_a_plain_fn_becomes_a_mean_over_examples_named_after_its_entry():
    metrics = build_metrics(lambda: {"err": absolute_error})
    assert isinstance(metrics["err"], keras.metrics.MeanMetricWrapper)
    assert metrics["err"].name == "err"
    labels, probabilities = _data(20, seed=5)
    metrics["err"].update_state(labels, probabilities)
    expected = np.mean(np.abs(labels - probabilities.max(axis=1)))
    assert float(metrics["err"].result()) == pytest.approx(expected, rel=1e-6)


def test_each_state_names_its_metric_and_carries_its_variables():
    metrics = build_metrics(eval_metrics_fn)
    states = to_states(metrics)
    assert [s.name for s in states] == list(metrics)
    for state, metric in zip(states, metrics.values()):
        assert len(state.variables) == len(metric.variables)


def test_results_leave_out_metrics_no_task_reported():
    metrics = build_metrics(eval_metrics_fn)
    _update(metrics, *_data(10, seed=1))
    sums = MetricSums()
    sums.add([s for s in to_states(metrics) if s.name == "accuracy"])
    assert list(sums.results(eval_metrics_fn)) == ["accuracy"]
    assert MetricSums().results(eval_metrics_fn) == {}


@pytest.mark.parametrize(
    "returned, named",
    [
        ([keras.metrics.AUC()], "list"),
        (None, "NoneType"),
        ({"accuracy": keras.metrics.AUC(), "threshold": 0.5}, "'threshold'"),
        ({"auc_name": "auc"}, "'auc_name'"),
    ],
)
def test_bad_eval_metrics_fn_returns_name_the_entry(returned, named):
    with pytest.raises(ModelSpecError, match=named) as info:
        build_metrics(lambda: returned)
    assert "eval_metrics_fn()" in str(info.value)
    assert "Received:" in str(info.value)
