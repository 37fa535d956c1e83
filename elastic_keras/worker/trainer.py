"""One worker's model: pulls parameters, computes gradients, pushes them, evaluates.

The model lives in the worker as a plain Keras model whose variables are overwritten with
the parameter servers' values before each step. The step runs under `tf.GradientTape`,
compiled with `tf.function` unless the model cannot be traced, in which case it runs
eagerly (with a warning).
"""

import json
import logging
import time

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import NotReadyError, PSError
from elastic_keras.common.metrics import build_metrics, to_states
from elastic_keras.common.model_variables import split_trainable

logger = logging.getLogger(__name__)


class Trainer:
    """Trains the module's model against the parameter servers.

    Args:
        spec: the loaded `ModelSpec`.
        ps_client: a `PSClient` for every shard.
        worker_id: this worker's id, sent with each push.
    """

    def __init__(self, spec, ps_client, worker_id):
        self._spec = spec
        self._ps = ps_client
        self._worker_id = worker_id
        self._model = None
        self._trainable = {}
        self._fixed = {}
        self._versions = None
        # Push sequence numbers only grow, across restarts too: a relaunched worker with the
        # same id must not have its pushes taken for retries of its predecessor's.
        self._sequence = time.time_ns()
        self._train_step = None
        self._forward = None

    @property
    def model_version(self):
        return max(self._versions) if self._versions else 0

    # -- model set-up ----------------------------------------------------------------------

    def _ensure_model(self, features):
        if self._model is not None:
            return
        model = self._spec.custom_model()
        model(features, training=False)  # builds every variable
        self._model = model
        self._trainable, self._fixed = split_trainable(model)
        initial = {n: v.numpy() for n, v in {**self._trainable, **self._fixed}.items()}
        optimizer_config = json.dumps(keras.optimizers.serialize(self._spec.optimizer()))
        self._ps.init_model(initial, optimizer_config)
        self._train_step = _compile(self._train_step_fn, "training step")
        self._forward = _compile(self._forward_fn, "forward pass")
        logger.info("Model built: %d trainable and %d other variables, %d parameters",
                    len(self._trainable), len(self._fixed),
                    sum(int(np.prod(v.shape)) for v in self._model.weights))

    def _pull(self):
        initialized, versions, values = self._ps.pull_dense(self._versions)
        if not initialized:
            raise NotReadyError("the parameter servers hold no model yet")
        variables = {**self._trainable, **self._fixed}
        for name, value in values.items():
            variable = variables.get(name)
            if variable is None:
                raise PSError(f"The parameter servers sent an unknown variable {name!r}.")
            variable.assign(value)
        self._versions = versions

    # -- steps -----------------------------------------------------------------------------

    def _train_step_fn(self, features, labels):
        with tf.GradientTape() as tape:
            predictions = self._model(features, training=True)
            loss = tf.reduce_mean(self._spec.loss(labels, predictions))
            if self._model.losses:
                loss += tf.add_n(self._model.losses)
        grads = tape.gradient(loss, list(self._trainable.values()))
        return loss, grads

    def _forward_fn(self, features):
        return self._model(features, training=False)

    def train_minibatch(self, features, labels):
        """Pulls, computes gradients, pushes; returns the minibatch's loss."""
        self._ensure_model(features)
        self._pull()
        loss, grads = self._train_step(features, labels)
        gradients = {
            name: grad for name, grad in zip(self._trainable, grads) if grad is not None
        }
        self._sequence += 1
        responses = self._ps.push_gradients(
            self._worker_id, self._sequence, self._versions, gradients,
            {name: v.numpy() for name, v in self._fixed.items()},
        )
        rejected = [r.reason for r in responses if not r.accepted]
        if rejected:
            raise PSError(f"A parameter server rejected the gradients: {rejected[0]}")
        return float(loss)

    def evaluate(self, batches):
        """Evaluates the current model on `(features, labels)` batches.

        Returns:
            The metrics' states as `MetricState` messages, for the master to add up.
        """
        metrics = None
        for features, labels in batches:
            self._ensure_model(features)
            if metrics is None:
                self._pull()
                metrics = build_metrics(self._spec.eval_metrics_fn)
            predictions = self._forward(features)
            for metric in metrics.values():
                metric.update_state(labels, predictions)
        return to_states(metrics or {})


def _compile(fn, what):
    """`fn` as a tf.function, falling back to eager execution if it cannot be traced."""
    compiled = tf.function(fn, reduce_retracing=True)
    state = {"fn": compiled}

    def call(*args):
        try:
            return state["fn"](*args)
        except (TypeError, NotImplementedError, tf.errors.OperatorNotAllowedInGraphError) as exc:
            if state["fn"] is not compiled:
                raise
            logger.warning("The %s cannot run as a tf.function (%s); running eagerly.",
                           what, exc)
            state["fn"] = fn
            return fn(*args)

    return call
