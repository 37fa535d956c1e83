"""Evaluation metrics whose states travel: workers send them, the master adds them up.

Every metric of `eval_metrics_fn()` becomes a Keras metric (a plain
`fn(labels, predictions)` is averaged over examples). A worker sends each metric's state
variables after its evaluation task; the master sums them across tasks and reads the result
from a fresh metric holding the sums. This is exact for metrics whose state variables add up
across batches, which is every built-in Keras metric (means, counts, confusion matrices, AUC
buckets).
"""

import keras
import numpy as np

from elastic_keras.common import tensor_codec
from elastic_keras.common.errors import ModelSpecError
from elastic_keras.proto import master_pb2


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


def to_states(metrics):
    """The wire form of the metrics' state variables."""
    return [
        master_pb2.MetricState(
            name=name,
            variables=[
                tensor_codec.encode(f"{name}/{i}", np.asarray(v.numpy()))
                for i, v in enumerate(metric.variables)
            ],
        )
        for name, metric in metrics.items()
    ]


class MetricSums:
    """Adds up metric states sent by workers, then computes the metrics' results."""

    def __init__(self):
        self._sums: dict[str, list] = {}

    def add(self, states):
        """Adds the `MetricState` messages of one finished evaluation task."""
        for state in states:
            values = [np.array(tensor_codec.decode(t)) for t in state.variables]
            sums = self._sums.get(state.name)
            if sums is None:
                self._sums[state.name] = values
            else:
                self._sums[state.name] = [a + b for a, b in zip(sums, values)]

    def results(self, eval_metrics_fn):
        """`{name: float}` of every metric, computed from the sums."""
        results = {}
        for name, metric in build_metrics(eval_metrics_fn).items():
            sums = self._sums.get(name)
            if sums is None:
                continue
            for variable, value in zip(metric.variables, sums):
                variable.assign(value.astype(variable.dtype))
            result = np.asarray(metric.result())
            results[name] = float(result) if result.size == 1 else result.tolist()
        return results
