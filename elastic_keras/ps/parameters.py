"""One shard's parameters: initialisation, pulls and asynchronous gradient pushes.

`Parameters` is the parameter server's domain object; it knows nothing of gRPC. It holds
the dense variables InitModel gave it as `tf.Variable`s, the Keras optimizer rebuilt from
the worker's config, the model version, and the highest sequence number applied per
worker. Pushes are asynchronous: each one is applied at once and bumps the version by one.
A push is checked completely before anything changes, and applied at most once.

Example:

    >>> import json, keras, numpy as np
    >>> params = Parameters()
    >>> sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
    >>> params.init_model([("w", np.array([1.0, 2.0], "float32"))], sgd)
    InitResult(initialized_now=True, model_version=0)
    >>> params.push(Push(worker_id=0, sequence=1, gradients=[("w", np.ones(2, "float32"))]))
    PushResult(accepted=True, model_version=1, reason='')
    >>> params.pull().dense["w"].tolist()
    [0.5, 1.5]
"""

import dataclasses
import threading

import tensorflow as tf

from elastic_keras.common.errors import NotReadyError
from elastic_keras.ps.optimizer import OptimizerApplier, optimizer_from_config
from elastic_keras.ps.updates import VariableSpec, check_initial_values, prepare_update

DUPLICATE = "duplicate"


@dataclasses.dataclass(frozen=True)
class Push:
    """Gradients from one worker step.

    `gradients` holds `(name, value)` pairs, each value a numpy array (dense) or a
    `tensor_codec.Slices` (rows); `assign` holds `(name, array)` pairs of new values for
    non-trainable variables. `(worker_id, sequence)` makes a retried push a no-op.
    """

    worker_id: int
    sequence: int
    model_version: int = 0
    gradients: tuple = ()
    assign: tuple = ()


@dataclasses.dataclass(frozen=True)
class PushResult:
    """`reason` is `DUPLICATE` for a push already applied, else empty."""

    accepted: bool
    model_version: int
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class InitResult:
    """`initialized_now` is False when the shard already held a model and kept it."""

    initialized_now: bool
    model_version: int


@dataclasses.dataclass(frozen=True)
class PullResult:
    """`dense` maps names to arrays; empty before init and when the caller's version is current."""

    initialized: bool
    model_version: int
    dense: dict


@dataclasses.dataclass(frozen=True)
class _Model:
    """What InitModel creates; fixed once published (only the variables' values change)."""

    variables: dict
    specs: dict
    applier: OptimizerApplier


class Parameters:
    """The dense variables, optimizer and model version of one parameter-server shard.

    Thread-safe: checking and casting a push happen outside the lock; applying it, pulls'
    snapshots and initialisation happen under it.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self._model = None
        self._version = 0
        self._applied_sequence = {}

    @property
    def initialized(self):
        return self._model is not None

    @property
    def version(self):
        return self._version

    def init_model(self, dense, optimizer_config):
        """Initialises the shard at version 0, unless it already holds a model.

        Of several concurrent calls exactly one initialises; the others keep its model.

        Args:
            dense: `(name, array)` pairs, the shard's variables and their initial values.
            optimizer_config: the JSON of `keras.optimizers.serialize(optimizer)`. Every
                floating-point variable gets the optimizer's slots, since the payload does
                not say which variables are trainable.

        Returns:
            An `InitResult`.

        Raises:
            PayloadError: a bad tensor list or optimizer config (checked on every call, before
                anything changes).
        """
        values = check_initial_values(dense)
        optimizer = optimizer_from_config(optimizer_config)
        with self._lock:
            if self._model is not None:
                return InitResult(initialized_now=False, model_version=self._version)
            variables = {name: tf.Variable(value, name=name) for name, value in values.items()}
            trainable = {n: v for n, v in variables.items() if v.dtype.is_floating}
            self._model = _Model(
                variables=variables,
                specs={name: VariableSpec.of(v) for name, v in variables.items()},
                applier=OptimizerApplier(optimizer, trainable),
            )
            self._version = 0
            return InitResult(initialized_now=True, model_version=0)

    def pull(self, known_version=-1):
        """The current values, or none when `known_version` is the current version.

        Returns:
            A `PullResult`; `initialized` is False (and `dense` empty) before InitModel.
        """
        with self._lock:
            model, version = self._model, self._version
            if model is None or known_version == version:
                return PullResult(initialized=model is not None, model_version=version, dense={})
            # A read is a snapshot: TF copies a variable's buffer before updating it while a
            # read tensor still refers to it, so converting outside the lock is safe.
            tensors = {name: v.read_value() for name, v in model.variables.items()}
        return PullResult(
            initialized=True,
            model_version=version,
            dense={name: t.numpy() for name, t in tensors.items()},
        )

    def push(self, push):
        """Applies a push at once (asynchronous training) and bumps the version by one.

        A push whose sequence is not above the highest one applied for its worker was
        applied before: it is acknowledged with reason `DUPLICATE` and not applied again.

        Returns:
            A `PushResult`.

        Raises:
            NotReadyError: the shard has no model yet.
            PayloadError: see `updates.prepare_update`; nothing is changed.
        """
        model = self._model
        if model is None:
            raise NotReadyError(
                "PushGradients needs an initialised shard: InitModel must come first. "
                f"Received: a push from worker {push.worker_id} before InitModel"
            )
        update = prepare_update(model.specs, push.gradients, push.assign)
        with self._lock:
            last = self._applied_sequence.get(push.worker_id)
            if last is not None and push.sequence <= last:
                return PushResult(accepted=True, model_version=self._version, reason=DUPLICATE)
            model.applier.apply(update.gradients)
            for name, value in update.assign.items():
                model.variables[name].assign(value)
            self._applied_sequence[push.worker_id] = push.sequence
            self._version += 1
            return PushResult(accepted=True, model_version=self._version)
