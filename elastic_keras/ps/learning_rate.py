"""The learning rate of a shard's optimizers, set while the job runs.

The master's callbacks (`LearningRateScheduler`, `ReduceLROnPlateau`) set it as Keras's
`fit` sets `model.optimizer.learning_rate`: the dense optimizer's learning-rate variable is
assigned (its compiled updates read it, staleness modulation still scales it), the tables'
sparse optimizer takes the value, and the shard's optimizer config records it, so a
checkpoint restores it. A rate set before the shard holds a model (a relaunched shard is
told the job's rate on its command line) applies once it has one, from InitModel or a
checkpoint. An optimizer whose rate is a schedule cannot be set, as in Keras.
"""

import dataclasses
import json
import logging
import math

from elastic_keras.common.errors import PayloadError

logger = logging.getLogger(__name__)


class LearningRateMixin:
    """Setting and reading the learning rate of a `Parameters` (its only user), under the
    shard's `_lock`, on its `_model`; `_learning_rate` is the rate set (None: the module's).
    `Parameters` passes a new or restored model through `_with_set_rate`."""

    def set_learning_rate(self, rate):
        """Sets the optimizers' learning rate now and for any model the shard builds later
        (see `ps.learning_rate`); returns the rate the shard's model uses (None: no model).

        Raises:
            PayloadError: a bad rate, or an optimizer whose rate is a schedule.
        """
        with self._lock:
            check_rate(rate)
            if self._model is not None:
                self._model = with_rate(self._model, rate)
            self._learning_rate = rate
            return current_rate(self._model) if self._model is not None else None

    @property
    def learning_rate(self):
        """The learning rate of the shard's model (None: a schedule); without a model, the
        rate set for it (None: none)."""
        with self._lock:
            return self._learning_rate if self._model is None else current_rate(self._model)

    def _with_set_rate(self, model):
        """`model` at the rate the master set, if any (a new or restored model)."""
        if self._learning_rate is None:
            return model
        try:
            return with_rate(model, self._learning_rate)
        except PayloadError as exc:
            logger.warning("Keeping the optimizer's own learning rate: %s", exc)
            return model


def current_rate(model):
    """The float learning rate of a shard's `ShardModel`, or None for a schedule."""
    rate = json.loads(model.optimizer_config).get("config", {}).get("learning_rate")
    return float(rate) if isinstance(rate, (int, float)) else None


def check_rate(rate):
    """Raises `PayloadError` unless `rate` is a finite number >= 0."""
    if not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate < 0:
        raise PayloadError(f"A learning rate must be a finite number >= 0. Received: {rate!r}")


def with_rate(model, rate):
    """`model` (a `ShardModel`) with its optimizers at learning rate `rate`.

    Raises:
        PayloadError: `rate` is not a finite number >= 0, or the optimizer's rate is a
            schedule.
    """
    check_rate(rate)
    config = json.loads(model.optimizer_config)
    options = config.get("config", {})
    if not isinstance(options.get("learning_rate"), (int, float)):
        raise PayloadError(
            "The optimizer's learning rate is a schedule, so it cannot be set (Keras refuses "
            f"too). Received: a rate of {rate} for {config.get('class_name')} with "
            f"learning_rate {options.get('learning_rate')!r}")
    model.applier.set_learning_rate(rate)
    if model.sparse_optimizer is not None:
        model.sparse_optimizer.set_learning_rate(rate)
    options["learning_rate"] = float(rate)
    return dataclasses.replace(model, optimizer_config=json.dumps(config))
