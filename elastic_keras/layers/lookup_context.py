"""The seam between PS-backed embedding layers and whoever serves their rows.

A layer backed by the parameter servers does not know where its rows come from. While a
`LookupContext` is current (`with lookup_context(ctx): ...`), every such layer call:

1. flattens its ids and deduplicates them with `tf.unique`;
2. asks `ctx.lookup_fn(table, unique_ids)` for those rows once, through `tf.numpy_function`,
   so it works eagerly and inside one `tf.function` that traces the whole step;
3. has `ctx.tape` watch the rows, if a tape is set;
4. appends a `LookupRecord(table, unique_ids, rows)` to `ctx.records`;
5. gathers the rows back into the shape of its ids.

The rows are the gradient targets: a training step asks its tape for the gradient of the
loss with respect to `[r.rows for r in ctx.records]` and sends them back as rows with
`merge_row_gradients`. A table used by several layers, or a layer called twice, gives
several records; `merge_row_gradients` sums the gradients of an id seen in more than one.

Example (a whole step in one `tf.function`; `rows_of` is any `lookup_fn`):

    >>> @tf.function
    ... def step(features, labels):
    ...     with tf.GradientTape() as tape:
    ...         ctx = LookupContext(rows_of, tape)
    ...         with lookup_context(ctx):
    ...             loss = loss_fn(labels, model(features, training=True))
    ...     row_grads = tape.gradient(loss, [r.rows for r in ctx.records])
    ...     return loss, [(r.table, r.unique_ids) for r in ctx.records], row_grads
    >>> loss, looked_up, row_grads = step(features, labels)  # doctest: +SKIP
    >>> merge_row_gradients(looked_up, row_grads)  # {table: (ids, grads)}  # doctest: +SKIP

The current context is thread-local and is read when a layer is called, i.e. when the step
is traced: the context, its `lookup_fn` and its tape belong to that trace. `lookup_fn` runs
later, whenever the compiled step runs, possibly on one of TensorFlow's own threads and
concurrently for two layers of the same step; it must be thread-safe.
"""

import contextlib
import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf


class LookupRecord(NamedTuple):
    """One lookup of one layer call: the table, its deduplicated int64 ids and their rows.

    Inside a traced step the fields are symbolic tensors of that step's graph.
    """

    table: str
    unique_ids: tf.Tensor
    rows: tf.Tensor


class LookupContext:
    """Serves embedding rows to PS-backed layers and records what they looked up.

    Args:
        lookup_fn: `lookup_fn(table, unique_ids) -> rows`: `table` a `str`, `unique_ids` a
            1-D `np.ndarray` of distinct int64 ids, `rows` an array of shape
            `[len(unique_ids), dim]` (cast to the layer's dtype). Never called with no ids.
        tape: an optional `tf.GradientTape` that watches every row tensor looked up.

    Raises:
        ValueError: `lookup_fn` is not callable.
    """

    def __init__(self, lookup_fn: Callable[[str, np.ndarray], Any], tape=None):
        if not callable(lookup_fn):
            raise ValueError(
                f"`lookup_fn` must be callable as lookup_fn(table, unique_ids). "
                f"Received: lookup_fn={lookup_fn!r}"
            )
        self.lookup_fn = lookup_fn
        self.tape = tape
        self.records: list[LookupRecord] = []
        self._dims: dict[str, int] = {}

    def lookup(self, table, unique_ids, dim, dtype):
        """The rows of `unique_ids` (a 1-D int64 tensor) from `lookup_fn`, recorded.

        Raises:
            ValueError: `table` was looked up earlier in this context with another `dim`.
        """
        known = self._dims.setdefault(table, dim)
        if known != dim:
            raise ValueError(
                f"Every layer that shares the embedding table {table!r} must have the same "
                f"output_dim. Received: output_dim={dim} after output_dim={known}"
            )
        dtype = tf.as_dtype(dtype)
        np_dtype = dtype.as_numpy_dtype
        lookup_fn = self.lookup_fn

        def fetch(ids):
            if ids.size == 0:
                return np.zeros((0, dim), np_dtype)
            rows = np.asarray(lookup_fn(table, ids), dtype=np_dtype)
            if rows.shape != (ids.size, dim):
                raise ValueError(
                    f"lookup_fn must return one row of {dim} values per id for table "
                    f"{table!r}. Received: shape={rows.shape} for {ids.size} ids"
                )
            return rows

        rows = tf.numpy_function(fetch, [unique_ids], dtype, name="ps_embedding_lookup")
        rows.set_shape([None, dim])
        if self.tape is not None:
            self.tape.watch(rows)
        self.records.append(LookupRecord(table, unique_ids, rows))
        return rows


_local = threading.local()


def current_context():
    """The innermost `LookupContext` entered on this thread, or None."""
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


@contextlib.contextmanager
def lookup_context(ctx):
    """Makes `ctx` the current `LookupContext` of this thread inside the `with` block.

    Raises:
        ValueError: `ctx` is not a `LookupContext`.
    """
    if not isinstance(ctx, LookupContext):
        raise ValueError(f"Expected a LookupContext. Received: ctx={ctx!r}")
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    stack.append(ctx)
    try:
        yield ctx
    finally:
        stack.pop()


def lookup_unique(table, ids, dim, dtype, fallback):
    """Deduplicates the int64 `ids` and serves their rows once.

    The rows come from the current `LookupContext` if there is one, else from
    `fallback(unique_ids)`.

    Returns:
        `(rows, index)`: `rows[index]` is the row of each id of `tf.reshape(ids, [-1])`.
    """
    unique_ids, index = tf.unique(tf.reshape(ids, [-1]))
    ctx = current_context()
    if ctx is not None:
        rows = ctx.lookup(table, unique_ids, dim, dtype)
    else:
        rows = fallback(unique_ids)
    return rows, index


def merge_row_gradients(looked_up, grads):
    """Sums the row gradients of a step per table and id.

    Args:
        looked_up: a sequence of `(table, unique_ids)`, one per `LookupRecord` of the step,
            as returned by it (`table` a `str`, `bytes` or scalar string tensor; `unique_ids`
            an int64 array or tensor).
        grads: the matching row gradients: arrays, tensors, `tf.IndexedSlices` or None (a
            record whose rows do not reach the loss; it is skipped).

    Returns:
        `{table: (ids, grads)}` with `ids` distinct int64 ids and `grads` of shape
        `[len(ids), dim]`: the sum of the gradients of each id over every record. A table
        looked up once keeps its record's ids and gradient as they are (its ids are distinct
        already); one looked up more than once gets its ids ascending.

    Raises:
        ValueError: the two sequences differ in length, or a gradient does not have one row
            per id.

    Example:

        >>> ids, g = merge_row_gradients(
        ...     [("t", np.array([3, 1])), ("t", np.array([1]))],
        ...     [np.ones((2, 2)), np.ones((1, 2))])["t"]
        >>> ids.tolist(), g.tolist()
        ([1, 3], [[2.0, 2.0], [1.0, 1.0]])
        >>> merge_row_gradients([("t", np.array([3, 1]))], [np.ones((2, 2))])["t"][0].tolist()
        [3, 1]
    """
    looked_up, grads = list(looked_up), list(grads)
    if len(looked_up) != len(grads):
        raise ValueError(
            "merge_row_gradients needs one gradient per lookup. "
            f"Received: {len(looked_up)} lookups and {len(grads)} gradients"
        )
    parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for (table, ids), grad in zip(looked_up, grads):
        if grad is None:
            continue
        table = _table_name(table)
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        grad = _dense_rows(grad, ids.size)
        parts.setdefault(table, []).append((ids, grad))
    merged = {}
    for table, pieces in parts.items():
        if len(pieces) == 1:
            merged[table] = pieces[0]
            continue
        all_ids = np.concatenate([ids for ids, _ in pieces])
        all_grads = np.concatenate([grad for _, grad in pieces])
        unique, inverse = np.unique(all_ids, return_inverse=True)
        summed = np.zeros((unique.size,) + all_grads.shape[1:], all_grads.dtype)
        np.add.at(summed, inverse, all_grads)
        merged[table] = (unique, summed)
    return merged


def _table_name(table):
    if isinstance(table, tf.Tensor):
        table = table.numpy()
    if isinstance(table, np.ndarray):
        table = table.item()
    return table.decode("utf-8") if isinstance(table, bytes) else str(table)


def _dense_rows(grad, num_ids):
    """A row gradient as a `[num_ids, dim]` array, whatever form the tape gave it in."""
    if isinstance(grad, tf.IndexedSlices):
        values = np.asarray(grad.values)
        dense = np.zeros((num_ids,) + values.shape[1:], values.dtype)
        np.add.at(dense, np.asarray(grad.indices), values)
        return dense
    grad = np.asarray(grad)
    if grad.ndim != 2 or grad.shape[0] != num_ids:
        raise ValueError(
            f"A row gradient must have one row per looked-up id. "
            f"Received: shape={grad.shape} for {num_ids} ids"
        )
    return grad
