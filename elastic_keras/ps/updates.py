"""Checks what a worker sends against the shard's variables, before anything is changed.

Everything here is a pure function of the payload and the shard's variable specs (names,
shapes and dtypes, fixed at initialisation) or its tables' row width and id range, so it
runs outside the shard's lock and a bad payload is rejected with `PayloadError` while the
variables, the tables, the optimizer and the model version stay as they were.

Example:

    >>> import numpy as np
    >>> specs = {"w": VariableSpec(shape=(2,), dtype=np.dtype("float32"))}
    >>> update = prepare_update(specs, [("w", np.ones(2, "float64"))], [])
    >>> update.gradients["w"].dtype.name
    'float32'
"""

import dataclasses

import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import NonFiniteError, PayloadError
from elastic_keras.common.transfer.tensor_codec import Slices

_NAMES_IN_MESSAGES = 5


@dataclasses.dataclass(frozen=True)
class VariableSpec:
    """What a payload for one variable must match.

    `trainable` variables take gradients (through the optimizer); the others take deltas,
    the changes a worker's step made to them (BatchNormalization statistics, counters).
    """

    shape: tuple
    dtype: np.dtype
    trainable: bool = True

    @property
    def floating(self):
        return tf.as_dtype(self.dtype).is_floating

    @classmethod
    def of(cls, value, trainable=None):
        """The spec of a numpy array or `tf.Variable`; trainable by default if floating."""
        dtype = value.dtype.as_numpy_dtype if isinstance(value.dtype, tf.DType) else value.dtype
        spec = cls(shape=tuple(value.shape), dtype=np.dtype(dtype))
        return dataclasses.replace(spec, trainable=spec.floating if trainable is None
                                   else trainable and spec.floating)


@dataclasses.dataclass(frozen=True)
class PreparedUpdate:
    """A checked push as tensors of the variables' dtypes, ready to apply.

    `gradients` maps names to dense tensors or `tf.IndexedSlices` (with unique row ids);
    `deltas` maps names of non-trainable variables to what to add to them.
    """

    gradients: dict
    deltas: dict


def check_initial_values(pairs):
    """Checks an `InitModel` payload: `(name, value)` pairs of dense arrays.

    Returns:
        `{name: array}` in the order given.

    Raises:
        PayloadError: a name is empty or repeated, or a value is sparse.
    """
    values = {}
    for name, value in pairs:
        _check_name(name, values, "InitModel tensor")
        if isinstance(value, Slices):
            raise PayloadError(
                f"InitModel tensor {name!r}: initial values must be dense tensors. "
                f"Received: a sparse tensor with {len(value.ids)} ids"
            )
        values[name] = value
    return values


def prepare_update(specs, gradients, deltas):
    """Checks a push's gradients and deltas and casts them to the variables' dtypes.

    Args:
        specs: `{name: VariableSpec}` of the shard's variables.
        gradients: `(name, value)` pairs; a value is a numpy array (dense gradient, the
            variable's shape) or `Slices` (rows of the variable; repeated ids are summed).
        deltas: `(name, array)` pairs of changes to non-trainable variables.

    Returns:
        A `PreparedUpdate`.

    Raises:
        PayloadError: an unknown or repeated name, a gradient for a variable that is not
            trainable, a delta for one that is, a dtype that cannot be cast to the
            variable's, a shape that does not match, or a row id out of range.
    """
    prepared_gradients = {}
    for name, value in gradients:
        what = f"Gradient {name!r}"
        spec = _spec_for(specs, name, prepared_gradients, what)
        if not spec.trainable:
            raise PayloadError(
                f"{what}: gradients apply only to trainable floating-point variables. "
                f"Received: a gradient for a non-trainable variable of dtype {spec.dtype.name}"
            )
        if isinstance(value, Slices):
            prepared_gradients[name] = _sparse_gradient(what, value, spec)
        else:
            prepared_gradients[name] = tf.convert_to_tensor(_dense(what, value, spec))
    prepared_deltas = {}
    for name, value in deltas:
        what = f"Delta {name!r}"
        spec = _spec_for(specs, name, prepared_deltas, what)
        if spec.trainable:
            raise PayloadError(
                f"{what}: deltas apply only to non-trainable variables; trainable ones change "
                "through gradients. Received: a delta for a trainable variable"
            )
        if isinstance(value, Slices):
            raise PayloadError(
                f"{what}: deltas must be dense. "
                f"Received: a sparse tensor with {len(value.ids)} ids"
            )
        prepared_deltas[name] = _dense(what, value, spec)
    return PreparedUpdate(gradients=prepared_gradients, deltas=prepared_deltas)


def check_table_rows(table, value):
    """Checks a push's gradient for an embedding table's rows.

    Args:
        table: the `EmbeddingTable` the rows belong to.
        value: the pushed gradient; it must be `Slices` of floating-point rows.

    Returns:
        `(ids, grads)`: the row ids and their `[n, dim]` gradients.

    Raises:
        PayloadError: a dense gradient, rows of another width or not floating point, or
            an id outside `[0, input_dim)` where the table has an `input_dim`.
    """
    what = f"Gradient of table {table.name!r}"
    if not isinstance(value, Slices):
        raise PayloadError(f"{what}: must be sparse rows with ids. Received: a dense tensor")
    ids, grads = np.asarray(value.ids), value.values
    if ids.ndim != 1 or (ids.dtype.kind not in "iu" and ids.size):
        raise PayloadError(f"{what}: ids must be a 1-D integer tensor. "
                           f"Received: dtype={ids.dtype.name}, shape={list(ids.shape)}")
    if grads.ndim != 2 or grads.shape[1] != table.dim:
        raise PayloadError(f"{what}: rows must have shape [n, {table.dim}]. "
                           f"Received: shape={list(grads.shape)}")
    if grads.dtype.kind != "f":
        raise PayloadError(f"{what}: rows must be floating point. "
                           f"Received: dtype={grads.dtype.name}")
    if table.input_dim and len(ids) and (ids.min() < 0 or ids.max() >= table.input_dim):
        raise PayloadError(f"{what}: ids must be in [0, {table.input_dim}). "
                           f"Received: ids from {ids.min()} to {ids.max()}")
    # A table without input_dim takes any int64 id, negative ones included (see `IdMap`).
    return ids.astype(np.int64, copy=False), _fitting(what, grads, np.dtype(table.dtype))


def non_finite(gradients, deltas):
    """`[(what, NaN count, Inf count)]` of the floating tensors of a push that hold NaN or
    Inf: its `(name, value)` gradients (arrays or `Slices`, dense or table rows) and deltas.
    """
    found = []
    for kind, pairs in (("Gradient", gradients), ("Delta", deltas)):
        for name, value in pairs:
            array = np.asarray(value.values if isinstance(value, Slices) else value)
            if array.dtype.kind != "f" or np.isfinite(array).all():
                continue
            found.append((f"{kind} {name!r}", int(np.count_nonzero(np.isnan(array))),
                          int(np.count_nonzero(np.isinf(array)))))
    return found


def non_finite_error(found, push):
    """The `NonFiniteError` refusing `push`, whose tensors `non_finite` `found` bad."""
    what, nans, infs = found[0]
    more = f" (and {len(found) - 1} more tensors)" if len(found) > 1 else ""
    return NonFiniteError(
        f"Push from worker {push.worker_id} (sequence {push.sequence}): gradients and deltas "
        f"must be finite (--non-finite-gradients fail); nothing of the push was applied. "
        f"Received: {what} with {nans} NaN and {infs} Inf{more}")


def check_sizes(dense, tables, limits):
    """Checks an InitModel's `(name, array)` dense values and `TableConfig`s against the
    shard's `PayloadLimits` (`--max-variable-elements`, `--max-embedding-dim`).

    Raises:
        PayloadError: a variable or a table's rows larger than the bound.
    """
    for name, value in dense:
        if isinstance(value, Slices):
            continue  # refused by `check_initial_values`
        size = int(np.prod(np.shape(value), dtype=object))
        if size > limits.max_variable_elements:
            raise PayloadError(
                f"InitModel tensor {name!r}: a variable may have at most "
                f"{limits.max_variable_elements} elements (--max-variable-elements). "
                f"Received: shape={list(np.shape(value))}")
    for table in tables:
        if table.dim > limits.max_embedding_dim:
            raise PayloadError(
                f"Embedding table {table.name!r}: dim may be at most "
                f"{limits.max_embedding_dim} (--max-embedding-dim). Received: dim={table.dim}")


def _check_name(name, seen, what):
    if not name:
        raise PayloadError(f"{what}: every tensor needs a name. Received: name=''")
    if name in seen:
        raise PayloadError(f"{what}: each name may appear once. Received: {name!r} twice")


def _spec_for(specs, name, seen, what):
    _check_name(name, seen, what)
    spec = specs.get(name)
    if spec is None:
        known = ", ".join(repr(n) for n in sorted(specs)[:_NAMES_IN_MESSAGES])
        more = ", ..." if len(specs) > _NAMES_IN_MESSAGES else ""
        raise PayloadError(
            f"{what}: the name must be one of this shard's {len(specs)} variables "
            f"({known}{more}). Received: name={name!r}"
        )
    return spec


def _cast(what, array, spec):
    if not np.can_cast(array.dtype, spec.dtype, casting="same_kind"):
        raise PayloadError(
            f"{what}: the dtype must be castable to the variable's {spec.dtype.name}. "
            f"Received: dtype={array.dtype.name}"
        )
    return _fitting(what, array, spec.dtype)


def _fitting(what, array, dtype):
    """`array` as `dtype`, refusing finite floating values the cast would make infinite (a
    float64 1e300 sent for a float32 variable)."""
    with np.errstate(over="ignore"):
        cast = np.asarray(array, dtype=dtype)
    if array.dtype.kind == "f" and cast.dtype.itemsize < array.dtype.itemsize:
        overflowed = np.isinf(cast) & np.isfinite(array)
        if overflowed.any():
            raise PayloadError(
                f"{what}: values must fit in {dtype.name}, the dtype they update. Received: "
                f"{int(np.count_nonzero(overflowed))} values beyond its range, up to "
                f"{float(np.abs(array[overflowed]).max()):g}")
    return cast


def _dense(what, array, spec):
    if tuple(array.shape) != spec.shape:
        raise PayloadError(
            f"{what}: the shape must equal the variable's {list(spec.shape)}. "
            f"Received: shape={list(array.shape)}"
        )
    return _cast(what, array, spec)


def _sparse_gradient(what, value, spec):
    if not spec.shape:
        raise PayloadError(
            f"{what}: sparse rows need a variable of rank 1 or more. Received: rows for a scalar"
        )
    rows, row_shape = spec.shape[0], spec.shape[1:]
    if tuple(value.values.shape[1:]) != row_shape:
        raise PayloadError(
            f"{what}: each row must have the variable's row shape {list(row_shape)}. "
            f"Received: rows of shape {list(value.values.shape[1:])}"
        )
    if value.dense_shape[0] not in (0, rows):
        raise PayloadError(
            f"{what}: dense_shape must be the variable's shape {list(spec.shape)}. "
            f"Received: dense_shape={list(value.dense_shape)}"
        )
    ids = np.asarray(value.ids)
    if ids.ndim != 1 or (ids.dtype.kind not in "iu" and ids.size):
        raise PayloadError(f"{what}: row ids must be a 1-D integer tensor. "
                           f"Received: dtype={ids.dtype.name}, shape={list(ids.shape)}")
    if len(ids) and (ids.min() < 0 or ids.max() >= rows):
        bad = ids.min() if ids.min() < 0 else ids.max()
        raise PayloadError(
            f"{what}: row ids must be in [0, {rows}), the variable's rows. Received: id {bad}"
        )
    value = value._replace(ids=ids.astype(np.int64, copy=False))
    values = _cast(what, value.values, spec)
    ids, values = _sum_repeated_ids(value.ids, values)
    return tf.IndexedSlices(
        tf.convert_to_tensor(values),
        tf.convert_to_tensor(ids, tf.int64),
        tf.constant(spec.shape, tf.int64),
    )


def _sum_repeated_ids(ids, values):
    """One row per id: rows of a repeated id are added, as in the dense gradient.

    Keras optimizers square and accumulate per row given, so a repeated id would otherwise
    count twice in Adam's second moment.
    """
    unique, inverse = np.unique(ids, return_inverse=True)
    if len(unique) == len(ids):
        return ids, values
    summed = np.zeros((len(unique), *values.shape[1:]), dtype=values.dtype)
    np.add.at(summed, inverse, values)
    return unique, summed
