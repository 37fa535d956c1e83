"""Evaluation metrics merged across tasks (elastic_keras.common.metrics).

Workers each evaluate a few tasks and send their metrics' state variables; the master merges
them. The result must equal one metric updated on all the data at once, for every class in
`keras.metrics`.
"""

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.transfer import tensor_codec
from elastic_keras.common.errors import ModelSpecError, PayloadError
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


# -- every class in keras.metrics: two workers merged equal one metric over all batches -----

FEATURES = 3
BATCH_SIZES = [16, 7, 32, 5, 24, 11]  # worker 1 takes the first two, worker 2 the rest


def _softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _batch(kind, n, rng):
    """`(labels, predictions)` of one batch of `n` examples, as a model of `kind` gives them."""
    if kind == "binary":  # labels (n, 1) in {0, 1}, probabilities (n, 1)
        labels = rng.integers(0, 2, size=(n, 1)).astype(np.float32)
        predictions = _sigmoid(2.0 * (labels - 0.5) + rng.normal(0.0, 1.5, size=(n, 1)))
    elif kind == "multilabel":  # labels (n, C) in {0, 1}, independent probabilities (n, C)
        labels = rng.integers(0, 2, size=(n, NUM_CLASSES)).astype(np.float32)
        predictions = _sigmoid(2.0 * (labels - 0.5) + rng.normal(size=labels.shape))
    elif kind in ("categorical", "sparse", "class_ids"):
        ids = rng.integers(0, NUM_CLASSES, size=n)
        logits = rng.normal(size=(n, NUM_CLASSES))
        logits[np.arange(n), ids] += rng.normal(1.0, 1.0, size=n)
        probabilities = _softmax(logits)
        if kind == "categorical":  # one-hot labels, probabilities
            labels, predictions = np.eye(NUM_CLASSES, dtype=np.float32)[ids], probabilities
        elif kind == "sparse":  # integer labels (n,), probabilities
            labels, predictions = ids.astype(np.int64), probabilities
        else:  # integer labels and predicted class ids, both (n,)
            labels, predictions = ids.astype(np.int64), probabilities.argmax(axis=-1)
    elif kind == "regression":  # real targets and predictions (n, FEATURES)
        labels = rng.normal(size=(n, FEATURES))
        predictions = 0.8 * labels + rng.normal(0.2, 0.5, size=labels.shape)
    elif kind == "positive":  # positive targets and predictions (n, FEATURES)
        labels = rng.uniform(0.5, 3.0, size=(n, FEATURES))
        predictions = labels * np.exp(rng.normal(0.0, 0.3, size=labels.shape))
    else:
        raise AssertionError(f"unknown kind {kind!r}")
    if predictions.dtype == np.float64:
        predictions = predictions.astype(np.float32)
    if labels.dtype == np.float64:
        labels = labels.astype(np.float32)
    return labels, predictions


M = keras.metrics
# Class name -> [(case id, a fresh metric, kind of data)]. Every class must have one.
CASES = {
    "AUC": [("roc", lambda: M.AUC(num_thresholds=50), "binary"),
            ("pr_multi_label_lazy", lambda: M.AUC(curve="PR", multi_label=True),
             "multilabel")],
    "Accuracy": [("", M.Accuracy, "class_ids")],
    "BinaryAccuracy": [("", M.BinaryAccuracy, "binary")],
    "BinaryCrossentropy": [("", M.BinaryCrossentropy, "binary")],
    "BinaryIoU": [("", lambda: M.BinaryIoU(target_class_ids=[0, 1], threshold=0.5),
                   "binary")],
    "CategoricalAccuracy": [("", M.CategoricalAccuracy, "categorical")],
    "CategoricalCrossentropy": [("", M.CategoricalCrossentropy, "categorical")],
    "CategoricalHinge": [("", M.CategoricalHinge, "categorical")],
    "ConcordanceCorrelation": [("", M.ConcordanceCorrelation, "regression")],
    "CosineSimilarity": [("", M.CosineSimilarity, "regression")],
    "F1Score": [("macro", lambda: M.F1Score(average="macro", threshold=0.5), "multilabel"),
                ("micro", lambda: M.F1Score(average="micro", threshold=0.5), "multilabel"),
                ("per_class_argmax", lambda: M.F1Score(), "categorical")],
    "FBetaScore": [("weighted", lambda: M.FBetaScore(average="weighted", beta=2.0,
                                                      threshold=0.4), "multilabel")],
    "FalseNegatives": [("", lambda: M.FalseNegatives(thresholds=[0.3, 0.7]), "binary")],
    "FalsePositives": [("", lambda: M.FalsePositives(thresholds=[0.3, 0.7]), "binary")],
    "Hinge": [("", M.Hinge, "binary")],
    "IoU": [("", lambda: M.IoU(num_classes=NUM_CLASSES, target_class_ids=[0, 2]),
             "class_ids")],
    "KLDivergence": [("", M.KLDivergence, "categorical")],
    "LogCoshError": [("", M.LogCoshError, "regression")],
    "Mean": [("weighted_by_predictions", M.Mean, "positive")],
    "MeanAbsoluteError": [("", M.MeanAbsoluteError, "regression")],
    "MeanAbsolutePercentageError": [("", M.MeanAbsolutePercentageError, "positive")],
    "MeanIoU": [("", lambda: M.MeanIoU(num_classes=NUM_CLASSES), "class_ids")],
    "MeanMetricWrapper": [("huber", lambda: M.MeanMetricWrapper(keras.losses.huber),
                           "regression")],
    "MeanSquaredError": [("", M.MeanSquaredError, "regression")],
    "MeanSquaredLogarithmicError": [("", M.MeanSquaredLogarithmicError, "positive")],
    "OneHotIoU": [("", lambda: M.OneHotIoU(num_classes=NUM_CLASSES, target_class_ids=[1, 3]),
                   "categorical")],
    "OneHotMeanIoU": [("", lambda: M.OneHotMeanIoU(num_classes=NUM_CLASSES), "categorical")],
    "PearsonCorrelation": [("", M.PearsonCorrelation, "regression")],
    "Poisson": [("", M.Poisson, "positive")],
    "Precision": [("thresholds", lambda: M.Precision(thresholds=[0.3, 0.5, 0.7]), "binary"),
                  ("top_k", lambda: M.Precision(top_k=2), "multilabel")],
    "PrecisionAtRecall": [("", lambda: M.PrecisionAtRecall(recall=0.6, num_thresholds=50),
                           "binary")],
    "R2Score": [("", M.R2Score, "regression"),
                ("variance_weighted_adjusted",
                 lambda: M.R2Score(class_aggregation="variance_weighted_average",
                                   num_regressors=2), "regression"),
                ("per_output", lambda: M.R2Score(class_aggregation=None), "regression")],
    "Recall": [("threshold", lambda: M.Recall(thresholds=0.4), "binary"),
               ("top_k_class", lambda: M.Recall(top_k=2, class_id=1), "multilabel")],
    "RecallAtPrecision": [("", lambda: M.RecallAtPrecision(precision=0.7), "binary")],
    "RootMeanSquaredError": [("", M.RootMeanSquaredError, "regression")],
    "SensitivityAtSpecificity": [("", lambda: M.SensitivityAtSpecificity(specificity=0.7),
                                  "binary")],
    "SparseCategoricalAccuracy": [("", M.SparseCategoricalAccuracy, "sparse")],
    "SparseCategoricalCrossentropy": [("", M.SparseCategoricalCrossentropy, "sparse")],
    "SparseTopKCategoricalAccuracy": [("", lambda: M.SparseTopKCategoricalAccuracy(k=2),
                                       "sparse")],
    "SpecificityAtSensitivity": [("", lambda: M.SpecificityAtSensitivity(sensitivity=0.7),
                                  "binary")],
    "SquaredHinge": [("", M.SquaredHinge, "binary")],
    "Sum": [("weighted_by_predictions", M.Sum, "positive")],
    "TopKCategoricalAccuracy": [("", lambda: M.TopKCategoricalAccuracy(k=2), "categorical")],
    "TrueNegatives": [("", lambda: M.TrueNegatives(thresholds=[0.3, 0.7]), "binary")],
    "TruePositives": [("", lambda: M.TruePositives(thresholds=[0.3, 0.7]), "binary")],
}


def _metric_classes():
    """Every class in `keras.metrics` that is a metric, but the abstract base `Metric`."""
    return sorted(
        name for name, cls in vars(keras.metrics).items()
        if isinstance(cls, type) and issubclass(cls, keras.metrics.Metric)
        and cls is not keras.metrics.Metric
    )


def _every_case():
    for class_name in _metric_classes():
        for case_id, make, kind in CASES.get(class_name, [("no case", None, None)]):
            yield pytest.param(class_name, make, kind,
                               id=f"{class_name}-{case_id}" if case_id else class_name)


def _two_workers_and_one(eval_fn, kind, seed=1):
    """`(merged results, results of one metric that saw every batch)`: worker 1 updates its
    metrics with the first two batches, worker 2 with the other four."""
    rng = np.random.default_rng(seed)
    batches = [_batch(kind, n, rng) for n in BATCH_SIZES]
    sums = MetricSums()
    for its_batches in (batches[:2], batches[2:]):
        worker = build_metrics(eval_fn)
        for labels, predictions in its_batches:
            for metric in worker.values():
                metric.update_state(labels, predictions)
        labels, predictions = its_batches[-1]
        sums.add(_over_the_wire(to_states(worker, labels=labels, predictions=predictions)))
    single = build_metrics(eval_fn)
    for labels, predictions in batches:
        for metric in single.values():
            metric.update_state(labels, predictions)
    return sums.results(eval_fn), {k: np.asarray(m.result()) for k, m in single.items()}


@pytest.mark.parametrize("class_name, make, kind", list(_every_case()))
def test_two_workers_merged_equal_one_metric_over_all_batches(class_name, make, kind):
    assert make is not None, f"add a case for keras.metrics.{class_name} to CASES"
    assert type(make()).__name__ == class_name
    merged, single = _two_workers_and_one(lambda: {"metric": make()}, kind)
    expected = single["metric"]
    assert np.all(np.isfinite(expected)), expected
    np.testing.assert_allclose(np.asarray(merged["metric"]), expected, rtol=1e-5, atol=1e-6)


def test_every_case_names_a_class_keras_has():
    assert set(CASES) <= set(_metric_classes())


def _mean_absolute_error(labels, predictions):
    return tf.reduce_mean(tf.abs(labels - predictions), axis=-1)


def _weird_binary(labels, predictions):
    """Not a mean of the batch: squared error of each example's worse half."""
    return tf.square(labels - predictions) * tf.cast(predictions > 0.5, tf.float32)


@pytest.mark.parametrize("fn, kind", [(_mean_absolute_error, "regression"),
                                      (_weird_binary, "binary")])
def test_plain_fns_merge_exactly(fn, kind):
    merged, single = _two_workers_and_one(lambda: {"fn": fn}, kind, seed=3)
    np.testing.assert_allclose(merged["fn"], single["fn"], rtol=1e-5)


# -- metrics that create their variables on their first update_state -------------------------

LAZY = {
    "f1": (lambda: M.F1Score(average="macro", threshold=0.5), "multilabel"),
    "fbeta": (lambda: M.FBetaScore(beta=0.5, threshold=0.5), "multilabel"),
    "r2": (M.R2Score, "regression"),
}


def _lazy_metrics():
    return {name: make() for name, (make, _) in LAZY.items()}


@pytest.mark.parametrize("name", sorted(LAZY))
def test_f1_fbeta_r2_are_built_at_the_master_from_the_input_shapes(name):
    make, kind = LAZY[name]
    # The fresh metric the master builds has fewer variables than a worker's: before the fix
    # the master assigned nothing and result() failed on missing attributes.
    fresh, updated = make(), make()
    updated.update_state(*_batch(kind, 8, np.random.default_rng(1)))
    assert len(fresh.variables) < len(updated.variables)
    merged, single = _two_workers_and_one(lambda: {name: make()}, kind, seed=7)
    np.testing.assert_allclose(np.asarray(merged[name]), single[name], rtol=1e-5, atol=1e-6)


def test_a_lazily_built_metric_without_input_shapes_is_named():
    metrics = {"f1": M.F1Score(threshold=0.5)}
    metrics["f1"].update_state(*_batch("multilabel", 8, np.random.default_rng(2)))
    sums = MetricSums()
    sums.add(_over_the_wire(to_states(metrics)))  # the worker sent no labels, predictions
    with pytest.raises(PayloadError, match=r"'f1' \(F1Score\) creates its variables") as info:
        sums.results(lambda: {"f1": M.F1Score(threshold=0.5)})
    assert "Received: 4 variables" in str(info.value)


def test_input_shapes_travel_with_batch_size_one_at_the_master():
    labels, predictions = _batch("multilabel", 8, np.random.default_rng(3))
    metrics = {"f1": M.F1Score(threshold=0.5)}
    metrics["f1"].update_state(labels, predictions)
    (state,) = _over_the_wire(to_states(metrics, labels=labels, predictions=predictions))
    assert list(state.labels.shape) == [8, NUM_CLASSES] and state.labels.dtype == "float32"
    assert list(state.predictions.shape) == [8, NUM_CLASSES]
    assert list(state.aggregations) == ["sum"] * 4
    (dict_state,) = to_states(metrics, labels={"a": labels}, predictions=predictions)
    assert not dict_state.HasField("labels")  # not one tensor: left out, not guessed


# -- aggregations other than "sum" ----------------------------------------------------------

class MeanScore(keras.metrics.Metric):
    """The mean prediction of each example's classes, with the class count as a setting."""

    def __init__(self, aggregation="only_first_replica", num_classes=NUM_CLASSES,
                 name="mean_score"):
        super().__init__(name=name)
        self.num_classes = self.add_variable((), "zeros", aggregation=aggregation,
                                             name="num_classes")
        self.num_classes.assign(float(num_classes))
        self.total = self.add_variable((), "zeros", name="total")
        self.count = self.add_variable((), "zeros", name="count")

    def update_state(self, labels, predictions, sample_weight=None):
        self.total.assign_add(keras.ops.sum(predictions))
        self.count.assign_add(float(predictions.shape[0]))

    def result(self):
        return self.total / (self.count * self.num_classes)


def test_an_only_first_replica_variable_is_kept_not_summed():
    merged, single = _two_workers_and_one(lambda: {"score": MeanScore()}, "categorical")
    assert merged["score"] == pytest.approx(float(single["score"]), rel=1e-6)
    assert merged["score"] == pytest.approx(1.0 / NUM_CLASSES, rel=1e-6)


def test_an_only_first_replica_variable_that_differs_is_refused():
    states = []
    for num_classes in (NUM_CLASSES, NUM_CLASSES + 1):
        metrics = {"score": MeanScore(num_classes=num_classes)}
        metrics["score"].update_state(*_batch("categorical", 5, np.random.default_rng(0)))
        states.append(_over_the_wire(to_states(metrics)))
    sums = MetricSums()
    sums.add(states[0])
    with pytest.raises(ModelSpecError, match="'score' variable 0 has aggregation "
                                             "'only_first_replica'.*Received: 5.0"):
        sums.add(states[1])


@pytest.mark.parametrize("aggregation", ["mean", "none"])
def test_a_variable_that_does_not_merge_exactly_is_refused_at_the_worker(aggregation):
    metrics = {"score": MeanScore(aggregation=aggregation)}
    with pytest.raises(ModelSpecError, match=f"'score' variable 'mean_score/num_classes'.*"
                                             f"Received: aggregation='{aggregation}'"):
        to_states(metrics)


# -- states that do not fit ------------------------------------------------------------------

def _auc_state(num_thresholds, seed=0):
    metrics = {"auc": M.AUC(num_thresholds=num_thresholds)}
    metrics["auc"].update_state(*_batch("binary", 10, np.random.default_rng(seed)))
    (state,) = _over_the_wire(to_states(metrics))
    return state


def test_a_state_with_other_variables_than_earlier_tasks_is_refused_and_merges_nothing():
    sums = MetricSums()
    sums.add([_auc_state(50)])
    before = sums.results(lambda: {"auc": M.AUC(num_thresholds=50)})

    fewer = _auc_state(50, seed=1)
    del fewer.variables[-1]
    fewer.aggregations.pop()
    with pytest.raises(PayloadError, match=r"'auc' state must have the variables earlier "
                                           r"tasks sent.*Received: \[\(\[50\], float32\)"):
        sums.add([fewer])

    with pytest.raises(PayloadError, match=r"Received: \[\(\[20\], float32\)"):
        sums.add([_auc_state(20)])

    float64 = _auc_state(50, seed=2)
    float64.variables[0].CopyFrom(tensor_codec.encode("auc/0", np.zeros(50, np.float64)))
    with pytest.raises(PayloadError, match=r"Received: \[\(\[50\], float64\)"):
        sums.add([_auc_state(50, seed=3), float64])  # the first of the two is not merged
    assert sums.results(lambda: {"auc": M.AUC(num_thresholds=50)}) == before


def test_a_state_that_does_not_fit_the_masters_metric_is_named():
    sums = MetricSums()
    sums.add([_auc_state(20)])
    with pytest.raises(PayloadError, match=r"'auc' \(AUC\) state must have one value per "
                                           r"variable.*\(\[50\], float32, sum\).*"
                                           r"Received: \[\(\[20\], float32, sum\)"):
        sums.results(lambda: {"auc": M.AUC(num_thresholds=50)})


@pytest.mark.parametrize(
    "spoil, message",
    [
        (lambda s: s.aggregations.__setitem__(0, "max"), r"aggregation of \('sum', "
                                                          r"'only_first_replica'\)"),
        (lambda s: s.aggregations.pop(), "Received: aggregations=.'sum', 'sum', 'sum'.$"),
        (lambda s: s.labels.shape.__setitem__(0, -3), r"'auc' labels must have dimensions "
                                                        r">= 0.*Received: shape=\[-3, 1\]"),
        (lambda s: setattr(s.predictions, "dtype", "complex7"), "dtype='complex7'"),
    ],
)
def test_a_malformed_state_is_refused(spoil, message):
    metrics = {"auc": M.AUC(num_thresholds=50)}
    labels, predictions = _batch("binary", 10, np.random.default_rng(0))
    metrics["auc"].update_state(labels, predictions)
    (state,) = _over_the_wire(to_states(metrics, labels=labels, predictions=predictions))
    spoil(state)
    with pytest.raises(PayloadError, match=message):
        MetricSums().add([state])
