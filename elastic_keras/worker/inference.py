"""Evaluation and prediction on a worker: every ensemble member's model over a task's
minibatches, their outputs combined.

A member is a `Trainer` over its own parameter-server shards (a training job has one). Each
task pulls every member's values once, at its first minibatch: the version a task sees is
pinned for its whole range. An ensemble's outputs combine per record, in TensorFlow, before
the metrics see them (`combine`):

- mean: the members' outputs averaged;
- vote: each member votes for one class per record, its output's argmax (an output of one
  unit: class 1 when above 0.5); the class with most votes wins (ties: the lowest class),
  returned one-hot in the output's shape and dtype.

A minibatch is read as Keras's `fit` and `predict` read one: a tuple is `(features,)`,
`(features, labels)` or `(features, labels, sample_weights)`, anything else is features. A
model whose inputs are a tuple gets them from a prediction dataset of `((x1, x2),)`.
"""

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.metrics import build_metrics, to_states
from elastic_keras.common.transfer.tensor_codec import encode


class Inference:
    """Evaluates and predicts with the models of `members` (Trainers), combined by
    `combiner` ("mean" or "vote") when there are several."""

    def __init__(self, spec, members, combiner="mean"):
        self._spec = spec
        self._members = list(members)
        self._combiner = combiner

    @property
    def model_version(self):
        """The version of the first member's model (a job's reports carry one)."""
        return self._members[0].model_version

    def _outputs(self, batches):
        """(features, labels or None, combined outputs) of each minibatch; each member's
        values are pulled at the first."""
        first = True
        for batch in batches:
            # As Keras's fit and predict read a batch: x, (x,), (x, y) or (x, y, weights).
            features, labels, _ = keras.utils.unpack_x_y_sample_weight(batch)
            if first:
                for member in self._members:
                    member.prepare(features)
                first = False
            outputs = [member.forward(features) for member in self._members]
            yield features, labels, combine(outputs, self._combiner)

    def evaluate(self, batches):
        """The metrics' states (`MetricState` messages) over `(features, labels)` batches."""
        metrics, labels, predictions = None, None, None
        for _, labels, predictions in self._outputs(batches):
            if metrics is None:
                metrics = build_metrics(self._spec.eval_metrics_fn)
            for metric in metrics.values():
                metric.update_state(labels, predictions)
        # One batch's shapes let the master build metrics whose state is made lazily.
        return to_states(metrics or {}, labels, predictions)

    def predict(self, batches, num_records):
        """The outputs for `num_records` records, as `Tensor` messages (one per output, see
        `ReportTaskResultRequest.predictions`), from feature batches.

        Raises:
            ModelSpecError: the model's outputs cannot travel (strings, or not one row per
                record), or the batches held another number of records.
        """
        parts = {}
        for _, _, outputs in self._outputs(batches):
            for name, value in _named_outputs(outputs).items():
                parts.setdefault(name, []).append(value)
        tensors = []
        for name, values in parts.items():
            array = np.concatenate(values) if values else np.zeros((0,))
            if len(array) != num_records:
                raise ModelSpecError(
                    f"The model's output {name or 'predictions'!r} has {len(array)} rows for "
                    f"{num_records} records: a model must return one row per record when "
                    "predicting")
            tensors.append(encode(name, array))
        return tensors


def _named_outputs(outputs):
    """`{name: numpy array}` of a model's outputs: a dict's keys, a list's positions ("0",
    "1", ...), "" for a single tensor."""
    if isinstance(outputs, dict):
        named = {str(k): v for k, v in outputs.items()}
    elif isinstance(outputs, (list, tuple)):
        named = {str(i): v for i, v in enumerate(outputs)}
    else:
        named = {"": outputs}
    arrays = {}
    for name, value in named.items():
        array = np.asarray(value)
        if array.dtype == np.bool_ or array.dtype.kind in "iu":
            array = array.astype(np.int32 if array.dtype.itemsize < 4 else np.int64)
        elif array.dtype.name == "bfloat16" or (array.dtype.kind == "f"
                                                 and array.dtype.itemsize not in (2, 4, 8)):
            array = array.astype(np.float32)
        if array.dtype.kind not in "fiu" or array.ndim == 0:
            raise ModelSpecError(
                f"The model's output {name or 'predictions'!r} cannot be written as "
                f"predictions: it must be a number tensor with one row per record. Received: "
                f"dtype {array.dtype}, shape {array.shape}")
        arrays[name] = array
    return arrays


def combine(outputs, combiner):
    """One output from the members' `outputs` (same structure each); see the module."""
    if len(outputs) == 1:
        return outputs[0]
    if combiner == "vote":
        return tf.nest.map_structure(lambda *xs: _vote(xs), *outputs)
    return tf.nest.map_structure(
        lambda *xs: tf.add_n([tf.cast(x, tf.float32) for x in xs]) / len(xs), *outputs)


def _vote(outputs):
    first = tf.convert_to_tensor(outputs[0])
    if first.shape.rank and first.shape.rank >= 2 and (first.shape[-1] or 0) > 1:
        depth = first.shape[-1]
        votes = tf.add_n([tf.one_hot(tf.argmax(x, axis=-1), depth) for x in outputs])
        return tf.one_hot(tf.argmax(votes, axis=-1), depth, dtype=first.dtype)
    ones = tf.add_n([tf.cast(tf.convert_to_tensor(x) > 0.5, tf.int32) for x in outputs])
    return tf.cast(2 * ones > len(outputs), first.dtype)
