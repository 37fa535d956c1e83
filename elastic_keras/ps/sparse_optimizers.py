"""Keras optimizers applied to the touched rows of an embedding table, in numpy.

A parameter server applies a worker's gradient for an embedding table row by row: it
gathers the rows the gradient touches and their optimizer slots, updates them with the
update rule of the module's Keras optimizer (`SGD`, `Adam`, `Adagrad`, `RMSprop`, `Ftrl`,
same hyperparameters, same formulas as Keras 3), and writes them back.

The semantics are *lazy*, as in TensorFlow's LazyAdam and the sparse kernels of TF 1: only
the rows a gradient touches and their slots change. A row with no gradient in a step keeps
its value and its slots, even where the dense Keras optimizer would still move it (momentum
carrying a row along, Adam's moments decaying, Ftrl's l2 shrinkage). For plain SGD and
Adagrad the two coincide. Step-dependent terms use the shard's global step: `step` is the
number of updates the shard has applied before this one plus one (Keras's
`iterations + 1`), so Adam's bias correction is the same for every row in a step, however
long ago the row was last touched. A learning-rate schedule is evaluated at `step - 1`, as
Keras evaluates it at `iterations` before incrementing.

Not supported, and refused with `PayloadError` by `from_keras_config`: other optimizer
classes, `weight_decay`, `use_ema` and `gradient_accumulation_steps`. `loss_scale_factor`
and clipping are the workers' (see `common/optimizer_contract.py`): the config given here
must be the shards' (`shard_config`), without them.

Example:

    >>> import numpy as np
    >>> sgd = from_keras_config({"class_name": "SGD", "config": {"learning_rate": 0.5}})
    >>> values = np.ones((2, 3), np.float32)
    >>> sgd.apply(values, {}, np.full((2, 3), 2.0, np.float32), step=1)
    >>> values.tolist()
    [[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
"""

import abc
import json

import numpy as np

from elastic_keras.common.errors import PayloadError
from elastic_keras.common.optimizer_contract import WORKER_OPTIONS
from elastic_keras.ps.optimizer import optimizer_from_config


class SparseOptimizer(abc.ABC):
    """Updates rows of an embedding table and their slots in place.

    Subclasses set `KERAS_OPTIONS` (their hyperparameters, named as in the Keras class),
    declare their slots in `slot_names`, and implement `_update`.

    Args:
        learning_rate: a float or a `keras.optimizers.schedules.LearningRateSchedule`.
    """

    KERAS_OPTIONS = ()

    def __init__(self, learning_rate):
        self._learning_rate = learning_rate
        self._cached_rate = (None, None)

    @property
    def slot_names(self):
        """The names of the per-row slots `apply` reads and writes, e.g. `("momentum",)`."""
        return ()

    def slot_initial_value(self, name):
        """The value every element of slot `name` of a new row starts from."""
        if name not in self.slot_names:
            raise ValueError(
                f"{type(self).__name__} has the slots {list(self.slot_names)}. "
                f"Received: name={name!r}"
            )
        return 0.0

    def set_learning_rate(self, rate):
        """Uses the float `rate` from now on (see `ps.learning_rate`)."""
        self._learning_rate = float(rate)

    def learning_rate(self, step):
        """The learning rate used at `step` (1-based), rounded to float32 as Keras keeps it."""
        if not callable(self._learning_rate):
            return float(np.float32(self._learning_rate))
        cached_step, rate = self._cached_rate
        if cached_step != step:
            rate = float(np.float32(self._learning_rate(step - 1)))
            self._cached_rate = (step, rate)
        return rate

    def apply(self, values, slots, grads, step, lr_scale=1.0):
        """Applies one update to the rows `values` and their `slots`, in place.

        Args:
            values: `[n, dim]` float array of the touched rows (distinct rows).
            slots: `{name: [n, dim] array}` for every name in `slot_names`.
            grads: `[n, dim]` gradients of those rows, of the same dtype (left unchanged).
            step: the 1-based global update count of the shard, including this update.
            lr_scale: a factor on this update's learning rate (staleness modulation).
        """
        if step < 1:
            raise ValueError(f"step counts updates from 1. Received: step={step}")
        self._update(values, slots, grads, self.learning_rate(step) * lr_scale, step)

    @abc.abstractmethod
    def _update(self, values, slots, grads, lr, step):
        """The update rule; `lr` is a Python float, `grads` must not be modified."""

    @staticmethod
    def from_keras_config(config):
        """See the module-level `from_keras_config`."""
        return from_keras_config(config)


class SGD(SparseOptimizer):
    """`keras.optimizers.SGD`: plain, with momentum, or Nesterov momentum."""

    KERAS_OPTIONS = ("momentum", "nesterov")

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.momentum, self.nesterov = float(momentum), bool(nesterov)

    @property
    def slot_names(self):
        return ("momentum",) if self.momentum != 0 else ()

    def _update(self, values, slots, grads, lr, step):
        step_size = grads * lr
        if self.momentum == 0:
            values -= step_size
            return
        momentum = slots["momentum"]
        momentum *= self.momentum
        momentum -= step_size
        if self.nesterov:
            values += momentum * self.momentum - step_size
        else:
            values += momentum


class Adam(SparseOptimizer):
    """`keras.optimizers.Adam`, AMSGrad included; bias correction from the global step."""

    KERAS_OPTIONS = ("beta_1", "beta_2", "epsilon", "amsgrad")

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                 amsgrad=False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.beta_1, self.beta_2 = float(beta_1), float(beta_2)
        self.epsilon, self.amsgrad = float(epsilon), bool(amsgrad)

    @property
    def slot_names(self):
        return ("momentum", "velocity", "velocity_hat") if self.amsgrad else (
            "momentum", "velocity")

    def _update(self, values, slots, grads, lr, step):
        real = values.dtype.type
        beta_1_power = real(self.beta_1) ** real(step)
        beta_2_power = real(self.beta_2) ** real(step)
        alpha = real(lr) * np.sqrt(1 - beta_2_power) / (1 - beta_1_power)
        momentum, velocity = slots["momentum"], slots["velocity"]
        momentum += (grads - momentum) * (1 - self.beta_1)
        velocity += (grads * grads - velocity) * (1 - self.beta_2)
        if self.amsgrad:
            np.maximum(slots["velocity_hat"], velocity, out=slots["velocity_hat"])
            velocity = slots["velocity_hat"]
        denominator = np.sqrt(velocity)
        denominator += self.epsilon
        step_size = momentum * alpha
        step_size /= denominator
        values -= step_size


class Adagrad(SparseOptimizer):
    """`keras.optimizers.Adagrad`."""

    KERAS_OPTIONS = ("initial_accumulator_value", "epsilon")

    def __init__(self, learning_rate=0.001, initial_accumulator_value=0.1, epsilon=1e-7,
                 **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.epsilon = float(epsilon)

    @property
    def slot_names(self):
        return ("accumulator",)

    def slot_initial_value(self, name):
        super().slot_initial_value(name)
        return self.initial_accumulator_value

    def _update(self, values, slots, grads, lr, step):
        accumulator = slots["accumulator"]
        accumulator += grads * grads
        step_size = grads * lr
        step_size /= np.sqrt(accumulator + self.epsilon)
        values -= step_size


class RMSprop(SparseOptimizer):
    """`keras.optimizers.RMSprop`, with optional momentum and centering."""

    KERAS_OPTIONS = ("rho", "momentum", "epsilon", "centered")

    def __init__(self, learning_rate=0.001, rho=0.9, momentum=0.0, epsilon=1e-7,
                 centered=False, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.rho, self.momentum = float(rho), float(momentum)
        self.epsilon, self.centered = float(epsilon), bool(centered)

    @property
    def slot_names(self):
        names = ["velocity"]
        if self.momentum > 0:
            names.append("momentum")
        if self.centered:
            names.append("average_gradient")
        return tuple(names)

    def _update(self, values, slots, grads, lr, step):
        rho = self.rho
        velocity = slots["velocity"]
        velocity *= rho
        velocity += (1 - rho) * (grads * grads)
        if self.centered:
            average = slots["average_gradient"]
            average *= rho
            average += (1 - rho) * grads
            denominator = velocity - average * average + self.epsilon
        else:
            denominator = velocity + self.epsilon
        increment = grads * lr
        increment /= np.sqrt(denominator)
        if self.momentum > 0:
            momentum = slots["momentum"]
            momentum *= self.momentum
            momentum += increment
            values -= momentum
        else:
            values -= increment


class Ftrl(SparseOptimizer):
    """`keras.optimizers.Ftrl` (FTRL-Proximal with l1, l2 and l2-shrinkage terms)."""

    KERAS_OPTIONS = (
        "learning_rate_power", "initial_accumulator_value", "l1_regularization_strength",
        "l2_regularization_strength", "l2_shrinkage_regularization_strength", "beta",
    )

    def __init__(self, learning_rate=0.001, learning_rate_power=-0.5,
                 initial_accumulator_value=0.1, l1_regularization_strength=0.0,
                 l2_regularization_strength=0.0, l2_shrinkage_regularization_strength=0.0,
                 beta=0.0, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.learning_rate_power = float(learning_rate_power)
        self.initial_accumulator_value = float(initial_accumulator_value)
        self.l1 = float(l1_regularization_strength)
        self.l2 = float(l2_regularization_strength)
        self.l2_shrinkage = float(l2_shrinkage_regularization_strength)
        self.beta = float(beta)

    @property
    def slot_names(self):
        return ("accumulator", "linear")

    def slot_initial_value(self, name):
        super().slot_initial_value(name)
        return self.initial_accumulator_value if name == "accumulator" else 0.0

    def _update(self, values, slots, grads, lr, step):
        real = values.dtype.type
        lr = real(lr)
        power = -self.learning_rate_power
        l2 = self.l2 + self.beta / (2.0 * lr)
        accumulator, linear = slots["accumulator"], slots["linear"]
        new_accumulator = accumulator + grads * grads
        new_power = np.power(new_accumulator, power)
        grads_to_use = grads + 2 * self.l2_shrinkage * values
        linear += grads_to_use - (new_power - np.power(accumulator, power)) / lr * values
        quadratic = new_power / lr + 2 * l2
        np.subtract(np.clip(linear, -self.l1, self.l1), linear, out=values)
        values /= quadratic
        accumulator[...] = new_accumulator


_REGISTRY = {cls.__name__: cls for cls in (SGD, Adam, Adagrad, RMSprop, Ftrl)}
# Options of every Keras optimizer that change the update: allowed only at their no-op value.
_UNSUPPORTED = ("weight_decay", "use_ema", "gradient_accumulation_steps")


def from_keras_config(config):
    """The sparse optimizer for the dict or JSON of `keras.optimizers.serialize(optimizer)`.

    Raises:
        PayloadError: the config is not a Keras optimizer, its class is not one of `SGD`,
            `Adam`, `Adagrad`, `RMSprop`, `Ftrl`, or it sets an option this module does not
            implement (see the module docstring).
    """
    text = config if isinstance(config, str) else json.dumps(config)
    optimizer = optimizer_from_config(text)
    name = type(optimizer).__name__
    cls = _REGISTRY.get(name)
    if cls is None:
        raise PayloadError(
            f"Embedding tables on the parameter servers support the optimizers "
            f"{', '.join(_REGISTRY)}. Received: {name}"
        )
    keras_config = optimizer.get_config()
    for option in _UNSUPPORTED:
        if keras_config.get(option):
            raise PayloadError(
                f"{name}: option {option} is not supported for embedding tables on the "
                f"parameter servers; leave it unset. Received: {option}={keras_config[option]!r}"
            )
    for option in WORKER_OPTIONS:
        if keras_config.get(option):
            raise PayloadError(
                f"{name}: option {option} is applied by the workers, before gradients reach "
                "the parameter servers, whose config must not hold it (see "
                f"optimizer_contract.shard_config). Received: {option}={keras_config[option]!r}"
            )
    learning_rate = keras_config["learning_rate"]
    if isinstance(learning_rate, dict):
        import keras  # deferred: only schedules need it

        learning_rate = keras.optimizers.schedules.deserialize(learning_rate)
    options = {option: keras_config[option] for option in cls.KERAS_OPTIONS}
    return cls(learning_rate=learning_rate, **options)
