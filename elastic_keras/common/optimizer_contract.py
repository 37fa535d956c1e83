"""Which Keras optimizers and options a job trains as Keras does, and where each runs.

Keras's `optimizer.apply(grads, variables)` does, in order: divide the gradients by
`loss_scale_factor`; clip them (`clipnorm`, `clipvalue` or `global_clipnorm`); decay the
weights; run the update step; apply the variables' constraints; update the moving averages
(`use_ema`). In a job the worker holds every gradient of a step, dense and embedding rows
for every shard, so it does the first two over the whole model, exactly as Keras would
(`GradientPrep`), and scales the loss as Keras's `fit` does. The parameter servers run the
rest with the optimizer rebuilt from `shard_config`: the module's config without the
options the worker has done. With `gradient_accumulation_steps`, Keras clips the
accumulated gradient, so clipping stays with the shards, which hold each dense variable
whole (exact for `clipnorm` and `clipvalue`; `global_clipnorm` is refused).

`check_optimizer` refuses, when the master checks the module, what a job could not train as
Keras would: a class that is not one of Keras's built-in optimizers (the parameter servers
rebuild the optimizer from its config and cannot import the module's code),
`LossScaleOptimizer` (its dynamic loss scale lives in the optimizer: use
`loss_scale_factor`), `MultiOptimizer`, and `global_clipnorm` with
`gradient_accumulation_steps`. Embedding tables on the parameter servers support fewer
options (see `ps/sparse_optimizers.py`).

Example:

    >>> import keras, numpy as np
    >>> prep = GradientPrep.of(keras.optimizers.SGD(0.1, global_clipnorm=1.0))
    >>> dense, rows = prep.apply({"w": np.array([3.0, 4.0], "float32")}, {})
    >>> dense["w"].tolist()
    [0.6000000238418579, 0.800000011920929]
"""

import dataclasses
import json

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import ModelSpecError

# Options of every Keras optimizer that the worker applies (before the shards' update).
WORKER_OPTIONS = ("loss_scale_factor", "clipnorm", "clipvalue", "global_clipnorm")
_CLIP_OPTIONS = WORKER_OPTIONS[1:]

# Built-in classes a job refuses, and why.
_REFUSED = {
    "LossScaleOptimizer": "its dynamic loss scale lives in the wrapped optimizer, which the "
                          "parameter servers hold apart from the workers that scale the loss; "
                          "use the optimizer's loss_scale_factor=... for a fixed scale",
    "MultiOptimizer": "it assigns optimizers to variables of the worker's model, which the "
                      "parameter servers do not hold as Keras variables",
}


def builtin_optimizers():
    """`{class name: class}` of Keras's built-in optimizers (`keras.optimizers.*`)."""
    return {
        name: value for name, value in vars(keras.optimizers).items()
        if isinstance(value, type) and issubclass(value, keras.optimizers.Optimizer)
        and value is not keras.optimizers.Optimizer
    }


def check_optimizer(optimizer):
    """Raises `ModelSpecError` if a job cannot train with `optimizer` as Keras would.

    Args:
        optimizer: what the module's `optimizer()` returned (a `keras.optimizers.Optimizer`).
    """
    name = type(optimizer).__name__
    builtin = builtin_optimizers()
    if builtin.get(name) is not type(optimizer):
        raise ModelSpecError(
            "optimizer() must return one of Keras's built-in optimizers "
            f"({', '.join(sorted(set(builtin) - set(_REFUSED)))}): the parameter servers "
            "rebuild it from its config and cannot import the module's classes. Received: "
            f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        )
    if name in _REFUSED:
        raise ModelSpecError(f"optimizer() returned a {name}, which a job does not support: "
                             f"{_REFUSED[name]}. Received: {name}")
    if optimizer.gradient_accumulation_steps and optimizer.global_clipnorm:
        raise ModelSpecError(
            f"optimizer() {name}: global_clipnorm with gradient_accumulation_steps is not "
            "supported: Keras clips the accumulated gradient of the whole model, which no "
            "single parameter server holds. Use clipnorm or clipvalue (per variable). "
            f"Received: global_clipnorm={optimizer.global_clipnorm}, "
            f"gradient_accumulation_steps={optimizer.gradient_accumulation_steps}"
        )


def shard_config(config):
    """The optimizer config the parameter servers run: without the worker's options.

    Args:
        config: the dict or JSON of `keras.optimizers.serialize(optimizer)`.

    Returns:
        The JSON text, with `loss_scale_factor` and (unless gradients are accumulated on the
        shards) the clipping options set to None; text that is no JSON object unchanged (for
        the caller's check to reject).
    """
    try:
        spec = json.loads(config if isinstance(config, str) else json.dumps(config))
    except ValueError:
        return config
    options = spec.get("config") if isinstance(spec, dict) else None
    if isinstance(options, dict):
        accumulated = bool(options.get("gradient_accumulation_steps"))
        for option in WORKER_OPTIONS:
            if option in options and not (accumulated and option in _CLIP_OPTIONS):
                options[option] = None
    return json.dumps(spec)


@dataclasses.dataclass(frozen=True)
class GradientPrep:
    """What the worker does to a step's gradients before pushing them, as Keras's `apply`.

    Attributes:
        loss_scale_factor: the loss is multiplied by it before differentiating, and the
            gradients divided by it (None: no scaling).
        clipnorm, clipvalue, global_clipnorm: Keras's clipping options (at most one set);
            None when the shards clip (gradient accumulation).
    """

    loss_scale_factor: float = None
    clipnorm: float = None
    clipvalue: float = None
    global_clipnorm: float = None

    @classmethod
    def of(cls, optimizer):
        """The preparation `optimizer`'s options ask for."""
        clip = not optimizer.gradient_accumulation_steps
        return cls(
            loss_scale_factor=optimizer.loss_scale_factor or None,
            clipnorm=(optimizer.clipnorm or None) if clip else None,
            clipvalue=(optimizer.clipvalue or None) if clip else None,
            global_clipnorm=(optimizer.global_clipnorm or None) if clip else None,
        )

    def scale_loss(self, loss):
        """The loss to differentiate (Keras's `optimizer.scale_loss`)."""
        return loss * self.loss_scale_factor if self.loss_scale_factor else loss

    def apply(self, dense, rows):
        """Unscales and clips a step's gradients as Keras's `apply` would.

        Args:
            dense: `{name: array or tf.IndexedSlices}` of the dense variables' gradients.
            rows: `{table: (ids, [n, dim] array)}` of the embedding tables' row gradients
                (each table one variable, for `clipnorm`).

        Returns:
            `(dense, rows)` of the same form.
        """
        if not (self.loss_scale_factor or self.clipnorm or self.clipvalue
                or self.global_clipnorm):
            return dense, rows
        values = {name: _values(g) for name, g in dense.items()}
        values.update({("rows", t): g for t, (_, g) in rows.items()})
        if self.loss_scale_factor:
            values = {k: v / np.asarray(self.loss_scale_factor, v.dtype)
                      for k, v in values.items()}
        if self.clipnorm:
            values = {k: _clip_by_norm(v, self.clipnorm) for k, v in values.items()}
        elif self.global_clipnorm:
            total = np.sqrt(sum(float(np.sum(np.square(v, dtype=np.float32)))
                                for v in values.values()))
            scale = self.global_clipnorm * min(1.0 / total if total else np.inf,
                                               1.0 / self.global_clipnorm)
            values = {k: v * np.asarray(scale, v.dtype) for k, v in values.items()}
        elif self.clipvalue:
            values = {k: np.clip(v, -self.clipvalue, self.clipvalue) for k, v in values.items()}
        prepared = {name: _with_values(g, values[name]) for name, g in dense.items()}
        return prepared, {t: (ids, values[("rows", t)]) for t, (ids, _) in rows.items()}


def _values(gradient):
    if isinstance(gradient, tf.IndexedSlices):
        return np.asarray(gradient.values)
    return np.asarray(gradient)


def _with_values(gradient, values):
    if isinstance(gradient, tf.IndexedSlices):
        return tf.IndexedSlices(tf.convert_to_tensor(values), gradient.indices,
                                gradient.dense_shape)
    return values


def _clip_by_norm(values, clipnorm):
    norm = float(np.sqrt(np.sum(np.square(values, dtype=np.float32))))
    return values * np.asarray(clipnorm / max(norm, clipnorm), values.dtype)
