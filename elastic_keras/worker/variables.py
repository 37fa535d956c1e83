"""What the worker derives from the model's dense variables: the options the shards need
to apply updates to them (InitModel), and what a training step changed in the non-trainable
ones (sent as deltas)."""

import json

import keras
import numpy as np

from elastic_keras.common.errors import ModelSpecError
from elastic_keras.proto import pserver_pb2


def non_trainable_deltas(before, variables):
    """`{name: change}` of the numeric `variables` that changed since `before`.

    Raises:
        ModelSpecError: a variable that is not a number changed (it cannot be merged).
    """
    deltas = {}
    for name, variable in variables.items():
        old, new = before[name], variable.numpy()
        if old.dtype.kind in "iuf":
            delta = new - old
            if delta.any():
                deltas[name] = delta
        elif not np.array_equal(old, new):
            raise ModelSpecError(
                f"The model's non-trainable variable {name!r} changed in a training step, "
                "but only numeric ones can be merged across workers (as deltas). Received: "
                f"dtype {old.dtype.name}"
            )
    return deltas


def variable_options(optimizer, trainable, fixed):
    """The `VariableOptions` messages of the dense variables, for InitModel.

    Raises:
        ModelSpecError: a variable has a constraint that is not one of Keras's built-in
            constraints (the parameter servers apply it and cannot import the module).
    """
    options = []
    decays = bool(optimizer.weight_decay)
    for name, variable in {**trainable, **fixed}.items():
        constraint = getattr(variable, "constraint", None)
        if constraint is not None and not type(constraint).__module__.startswith("keras."):
            raise ModelSpecError(
                f"Variable {name!r} has a constraint the parameter servers cannot rebuild: "
                "only Keras's built-in constraints (keras.constraints.*) are supported. "
                f"Received: {type(constraint).__module__}.{type(constraint).__qualname__}"
            )
        options.append(pserver_pb2.VariableOptions(
            name=name, trainable=name in trainable,
            constraint=(json.dumps(keras.constraints.serialize(constraint))
                        if constraint is not None and name in trainable else ""),
            exclude_from_weight_decay=(decays and name in trainable
                                       and not optimizer._use_weight_decay(variable)),
        ))
    return options
