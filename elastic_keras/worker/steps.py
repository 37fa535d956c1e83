"""A worker's training and inference steps: compiled where they can be, and what they
computed summed and checked before anything of it leaves the worker."""

import logging

import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)


def compile_step(fn, what):
    """`fn` as a tf.function, falling back to eager execution if it cannot be traced.

    Traced without AutoGraph: our step is plain TensorFlow, and converting it took 0.15 s of
    a worker's first step. What it calls of the module's own goes through `converted`; Keras
    (the model's call) AutoGraph never converts."""
    compiled = tf.function(fn, reduce_retracing=True, autograph=False)
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


def converted(fn):
    """`fn`, a function of the module's, as AutoGraph converts what a `tf.function` calls:
    Python control flow on tensors becomes graph ops, and an error raised while tracing it
    names the module's lines ("in user code"), as in a step traced with AutoGraph."""
    def call(*args):
        return fn(*args)

    try:
        graph_call = tf.autograph.to_graph(call)
    except Exception as exc:  # no source to read (an install without .py files)
        logger.warning("The module's %s runs as written, not converted by AutoGraph: %s",
                       getattr(fn, "__name__", fn), exc)
        return fn

    def traced(*args):
        try:
            return graph_call(*args)
        except Exception as exc:
            metadata = getattr(exc, "ag_error_metadata", None)  # what tf.function reads
            if metadata is None:
                raise
            raise metadata.to_exception(exc) from None

    return traced


def row_sums(grad, rows):
    """A lookup's row gradient as one summed row per looked-up id, in the step's graph: the
    tape gives a gather's gradient as a row per use of an id (`tf.IndexedSlices`)."""
    if isinstance(grad, tf.IndexedSlices):
        return tf.math.unsorted_segment_sum(grad.values, grad.indices, tf.shape(rows)[0])
    return grad


def not_finite(gradients, deltas):
    """The first of a step's gradients (arrays or `tf.IndexedSlices`) and deltas that holds
    NaN or Inf, named ("gradient 'w'"), or ""."""
    for kind, values in (("gradient", gradients), ("the change to", deltas)):
        for name, value in values.items():
            array = np.asarray(value.values if isinstance(value, tf.IndexedSlices) else value)
            if array.dtype.kind == "f" and not np.isfinite(array).all():
                return f"{kind} {name!r}"
    return ""


def assign_all(pairs):
    """Assigns each `(variable, value)` of `pairs` (a value of the variable's dtype and
    shape) by one eager op on the variable's handle. A Keras variable's own `assign` costs
    a fraction of a millisecond of Python each, and one compiled call binds every value
    against its signature in Python: 0.75 ms for the 6 variables of the bench MLP and 4.9
    ms for 100 small ones, against 0.18 and 2.0 ms for these ops."""
    for variable, value in pairs:
        tf.raw_ops.AssignVariableOp(resource=variable.handle, value=value, validate_shape=True)
