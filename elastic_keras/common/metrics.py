"""Evaluation metrics whose states travel: workers send them, the master merges them.

Every metric of `eval_metrics_fn()` becomes a Keras metric (a plain `fn(labels, predictions)`
becomes its mean over examples). After an evaluation task a worker sends each metric's state
variables (`to_states`); the master merges them across tasks (`MetricSums.add`) and reads
each result from a fresh metric of `eval_metrics_fn()` that holds the merged state
(`MetricSums.results`).

What is exact: the merged result equals the result of one metric updated with every batch of
every task, for every metric whose variables merge the way their Keras `aggregation` says,
as Keras's distribution strategies merge replicas:

- "sum": added up. Every variable of every class in `keras.metrics` is one: totals and
  counts of the means (accuracies, losses, PearsonCorrelation and ConcordanceCorrelation,
  which are means of per-example correlations), confusion counts per threshold (AUC,
  Precision, Recall, PrecisionAtRecall, ...), confusion matrices (IoU, MeanIoU, ...), the
  per-class counts of F1Score and FBetaScore and the sums, sums of squares and counts of
  R2Score. None is a running mean, a maximum or a setting kept in a variable, and every
  result is computed from these sums, so every built-in metric is exact.
- "only_first_replica" (a custom metric's setting, such as a number of classes): kept as
  the first task sent it. Tasks that send different values raise `ModelSpecError`.
- "mean" or "none" (the default of a bare `keras.Variable`): `to_states` refuses them with
  `ModelSpecError`. A mean over tasks is exact only when every task saw as many examples;
  such a metric should keep a total and a count, both "sum".

Some metrics create their variables on their first `update_state`: F1Score, FBetaScore,
R2Score, and AUC(multi_label=True) without `num_labels`. A fresh metric at the master has
none of them yet, so the worker also sends the shapes and dtypes of one batch of labels and
predictions (`to_states(metrics, labels, predictions)`), and the master builds its fresh
metric by updating it once with zeros of those shapes (batch size 1) before it assigns the
merged state, which replaces whatever that update left.

"Exact" is up to float rounding: sums added in another order (relative differences about
1e-7 for float32 states). A state that does not fit (variables that differ in count, shape,
dtype or aggregation from earlier tasks' or from the master's metric) raises `PayloadError`,
naming the metric.

Example:

    >>> import keras
    >>> metrics = build_metrics(lambda: {"f1": keras.metrics.F1Score(threshold=0.5)})
    >>> metrics["f1"].update_state([[1.0, 0.0]], [[0.9, 0.2]])
    >>> sums = MetricSums()
    >>> sums.add(to_states(metrics, labels=[[1.0, 0.0]], predictions=[[0.9, 0.2]]))
    >>> f1 = sums.results(lambda: {"f1": keras.metrics.F1Score(threshold=0.5)})["f1"]
    >>> [round(value, 3) for value in f1]
    [1.0, 0.0]
"""

import dataclasses
import threading

import keras
import numpy as np

from elastic_keras.common.transfer import tensor_codec
from elastic_keras.common.errors import ModelSpecError, PayloadError
from elastic_keras.proto import master_pb2

_SUM, _FIRST = "sum", "only_first_replica"
_MERGES = (_SUM, _FIRST)  # the variable aggregations that merge exactly


def build_metrics(eval_metrics_fn):
    """`{name: keras.metrics.Metric}` from the module's `eval_metrics_fn`."""
    metrics = eval_metrics_fn()
    if not isinstance(metrics, dict):
        raise ModelSpecError(
            "eval_metrics_fn() must return a dict {name: keras metric or "
            f"fn(labels, predictions)}}. Received: {type(metrics).__name__}"
        )
    built = {}
    for name, metric in metrics.items():
        if isinstance(metric, keras.metrics.Metric):
            built[name] = metric
        elif callable(metric):
            built[name] = keras.metrics.MeanMetricWrapper(metric, name=name)
        else:
            raise ModelSpecError(
                f"eval_metrics_fn() entry {name!r} must be a keras metric or a callable "
                f"fn(labels, predictions). Received: {metric!r}"
            )
    return built


def to_states(metrics, labels=None, predictions=None):
    """The wire form of the metrics' states, for the master to merge.

    Args:
        metrics: `{name: keras.metrics.Metric}` from `build_metrics`, after `update_state`.
        labels: one batch of the labels the metrics were updated with; only its shape and
            dtype travel. A metric that creates its variables on its first `update_state`
            (F1Score, R2Score, ...) needs it and `predictions` at the master.
        predictions: one batch of the predictions, likewise.

    Returns:
        A list of `MetricState` messages, one per metric.

    Raises:
        ModelSpecError: a variable's aggregation is neither "sum" nor "only_first_replica",
            or its dtype cannot travel.
    """
    labels_spec, predictions_spec = _input_spec(labels), _input_spec(predictions)
    return [
        master_pb2.MetricState(
            name=name,
            variables=[_encode(name, i, v) for i, v in enumerate(metric.variables)],
            aggregations=[_aggregation(name, v) for v in metric.variables],
            labels=labels_spec,
            predictions=predictions_spec,
        )
        for name, metric in metrics.items()
    ]


def _input_spec(batch):
    """The shape and dtype of one batch; None for no batch, or for one that is not one
    tensor (a dict of them, say): a metric that needs it then fails at the master, by name."""
    if batch is None or isinstance(batch, dict):
        return None
    try:
        if not (hasattr(batch, "shape") and hasattr(batch, "dtype")):
            batch = np.asarray(batch)  # a nested list of numbers
        shape = [int(d) for d in batch.shape]
        dtype = keras.backend.standardize_dtype(batch.dtype)
    except (TypeError, ValueError):  # ragged, or of no dtype Keras knows
        return None
    return master_pb2.MetricState.InputSpec(shape=shape, dtype=dtype)


def _aggregation(name, variable):
    if variable.aggregation not in _MERGES:
        raise ModelSpecError(
            f"Metric {name!r} variable {variable.path!r} must have aggregation 'sum' (it "
            "adds up across workers) or 'only_first_replica' (it is the same in every "
            "worker): a mean across workers is exact only when each saw as many examples. "
            "Keep a total and a count, each made with add_variable(..., aggregation='sum'). "
            f"Received: aggregation={variable.aggregation!r}"
        )
    return variable.aggregation


def _encode(name, index, variable):
    try:
        return tensor_codec.encode(f"{name}/{index}", np.asarray(variable.numpy()))
    except PayloadError as exc:
        raise ModelSpecError(
            f"Metric {name!r} variable {variable.path!r} cannot travel to the master: {exc}"
        ) from exc


@dataclasses.dataclass
class _Merged:
    """One metric's state merged over the tasks so far."""

    values: list          # one np.ndarray per variable
    aggregations: list    # one of _MERGES per variable
    labels: object        # MetricState.InputSpec of one batch, or None
    predictions: object


class MetricSums:
    """Merges metric states sent by workers, then computes the metrics' results."""

    def __init__(self):
        self._merged: dict[str, _Merged] = {}
        self._lock = threading.Lock()

    def add(self, states):
        """Merges the `MetricState` messages of one finished evaluation task.

        Raises:
            PayloadError: a state is malformed, or its variables differ in count, shape,
                dtype or aggregation from those an earlier task sent for the same metric.
                Nothing of `states` is merged then.
            ModelSpecError: an "only_first_replica" variable differs from an earlier task's.
        """
        with self._lock:
            merged = dict(self._merged)
            for state in states:
                received = _decode(state)
                earlier = merged.get(state.name)
                merged[state.name] = (received if earlier is None
                                      else _merge(state.name, earlier, received))
            self._merged = merged

    def check(self, states, eval_metrics_fn):
        """Raises what `add(states)` and then `results(eval_metrics_fn)` would raise, and
        changes nothing: a task's states are checked before the task counts as done."""
        trial = MetricSums()
        with self._lock:
            trial._merged = dict(self._merged)
        trial.add(states)
        trial.results(eval_metrics_fn)

    def results(self, eval_metrics_fn):
        """`{name: float, or a list for a metric with several values}` of every metric some
        task reported, computed from the merged states.

        Raises:
            PayloadError: a merged state does not fit the metric `eval_metrics_fn()` builds
                (count, shape, dtype or aggregation of its variables), or a metric that
                creates its variables on its first update_state came without input shapes.
        """
        with self._lock:
            merged_states = dict(self._merged)
        results = {}
        for name, metric in build_metrics(eval_metrics_fn).items():
            merged = merged_states.get(name)
            if merged is None:
                continue
            if len(metric.variables) < len(merged.values):
                _build(name, metric, merged)
            _check_fits(name, metric, merged)
            for variable, value in zip(metric.variables, merged.values):
                variable.assign(value)
            result = np.asarray(metric.result())
            results[name] = float(result) if result.size == 1 else result.tolist()
        return results


def _decode(state):
    """A `_Merged` of one task's state, checked on its own."""
    name = state.name
    values = []
    for tensor in state.variables:
        value = tensor_codec.decode(tensor)
        if not isinstance(value, np.ndarray):
            raise PayloadError(f"Metric {name!r} variables must be dense tensors. "
                               f"Received: a sparse tensor {tensor.name!r}")
        values.append(np.array(value))
    aggregations = list(state.aggregations) or [_SUM] * len(values)
    if len(aggregations) != len(values) or any(a not in _MERGES for a in aggregations):
        raise PayloadError(
            f"Metric {name!r} state must give each of its {len(values)} variables an "
            f"aggregation of {_MERGES}, or none at all. Received: aggregations={aggregations}"
        )
    return _Merged(values, aggregations, _checked_spec(state, "labels"),
                   _checked_spec(state, "predictions"))


def _checked_spec(state, field):
    if not state.HasField(field):
        return None
    spec = getattr(state, field)
    try:
        keras.backend.standardize_dtype(spec.dtype)
        valid = all(d >= 0 for d in spec.shape)
    except ValueError:
        valid = False
    if not valid:
        raise PayloadError(
            f"Metric {state.name!r} {field} must have dimensions >= 0 and a Keras dtype. "
            f"Received: shape={list(spec.shape)}, dtype={spec.dtype!r}"
        )
    return spec


def _merge(name, earlier, received):
    """`earlier` and `received` merged variable by variable, or PayloadError if they differ
    in layout."""
    layout = [(v.shape, v.dtype) for v in earlier.values]
    got = [(v.shape, v.dtype) for v in received.values]
    if got != layout or received.aggregations != earlier.aggregations:
        raise PayloadError(
            f"Metric {name!r} state must have the variables earlier tasks sent, as (shape, "
            f"dtype): {_layout(layout)} with aggregations {earlier.aggregations}. Received: "
            f"{_layout(got)} with aggregations {received.aggregations}"
        )
    values = []
    for i, (total, value, aggregation) in enumerate(
            zip(earlier.values, received.values, earlier.aggregations)):
        if aggregation == _SUM:
            values.append(total + value)
        elif np.array_equal(total, value):
            values.append(total)
        else:
            raise ModelSpecError(
                f"Metric {name!r} variable {i} has aggregation 'only_first_replica', so every "
                f"task must send the same value, here {total.tolist()}. Received: "
                f"{value.tolist()}"
            )
    return _Merged(
        values,
        earlier.aggregations,
        earlier.labels if earlier.labels is not None else received.labels,
        earlier.predictions if earlier.predictions is not None else received.predictions,
    )


def _layout(shapes_and_dtypes):
    return "[" + ", ".join(f"({list(s)}, {d.name})" for s, d in shapes_and_dtypes) + "]"


def _build(name, metric, merged):
    """Creates the variables of a metric that makes them on its first `update_state`, by
    updating it with zeros shaped like one batch of its inputs (batch size 1)."""
    kind = type(metric).__name__
    if merged.labels is None or merged.predictions is None:
        raise PayloadError(
            f"Metric {name!r} ({kind}) creates its variables on its first update_state, so "
            "its state must come with the shapes of one batch of labels and predictions "
            "(to_states(metrics, labels, predictions)). Received: "
            f"{len(merged.values)} variables for a metric with {len(metric.variables)} "
            "before update_state, and no input shapes"
        )
    try:
        metric.update_state(_zeros(merged.labels), _zeros(merged.predictions))
    except Exception as exc:
        raise PayloadError(
            f"Metric {name!r} ({kind}) must build from the input shapes its state came with. "
            f"Received: labels={_spec_text(merged.labels)}, "
            f"predictions={_spec_text(merged.predictions)}"
        ) from exc


def _zeros(spec):
    shape = list(spec.shape)
    if shape:
        shape[0] = 1
    return keras.ops.zeros(shape, dtype=spec.dtype)


def _spec_text(spec):
    return f"(shape={list(spec.shape)}, dtype={spec.dtype})"


def _check_fits(name, metric, merged):
    """PayloadError unless the merged state fits the metric's variables one to one."""
    expected = [
        (tuple(v.shape), keras.backend.standardize_dtype(v.dtype), v.aggregation)
        for v in metric.variables
    ]
    got = [
        (value.shape, keras.backend.standardize_dtype(value.dtype), aggregation)
        for value, aggregation in zip(merged.values, merged.aggregations)
    ]
    if got != expected:
        raise PayloadError(
            f"Metric {name!r} ({type(metric).__name__}) state must have one value per "
            "variable of the metric, as (shape, dtype, aggregation): "
            f"{_fit_text(expected)}. Received: {_fit_text(got)}"
        )


def _fit_text(rows):
    return "[" + ", ".join(f"({list(s)}, {d}, {a})" for s, d, a in rows) + "]"
