"""Id tensors of the embedding layers: raw ids of any shape to flat ids and segments, and
back; checks of ids and of the table rows a layer loads.

`segments(inputs)` accepts a dense tensor, a `tf.RaggedTensor` (ragged in its last axis) or
a `tf.SparseTensor` of ids, and hands back the flat ids, the output row of each, the number
of output rows and a function that shapes combined `[rows, dim]` vectors like the input.
"""

import numpy as np
import tensorflow as tf


def check_id_range(ids, input_dim, layer_name):
    """`ids` (int64), checked in the graph to lie in `[0, input_dim)` unless it is None.

    One `Assert` of the smallest and largest id: `assert_non_negative` and `assert_less`
    build a summary of the data each, 0.14 s of tracing a step of two lookups."""
    if input_dim is None:
        return ids
    low, high = tf.reduce_min(ids), tf.reduce_max(ids)  # of none: the int64 extremes
    check = tf.debugging.Assert(
        tf.logical_and(low >= 0, high < input_dim),
        [f"Embedding {layer_name!r}: ids must be in [0, input_dim={input_dim}). Received "
         "ids from", low, "to", high])
    with tf.control_dependencies([check]):
        return tf.identity(ids)


def gather_rows(rows, index, ids, dim):
    """`rows[index]` in the shape of `ids` plus a last axis of `dim`."""
    vectors = tf.reshape(tf.gather(rows, index), tf.concat([tf.shape(ids), [dim]], 0))
    vectors.set_shape(ids.shape.concatenate([dim]))
    return vectors


def padding(dtype):
    """The padding id of `mask_zero` for raw ids of `dtype`: 0, or "" for strings."""
    dtype = tf.as_dtype(dtype)
    return tf.constant("" if dtype == tf.string else 0, dtype)


def check_table_rows(what, ids, rows, default_row, dim, input_dim, dtype):
    """`load_table`'s arguments as arrays, or a ValueError naming what is wrong.

    `what` names the layer in messages; `input_dim` None means unbounded.
    """
    ids = np.asarray(ids)
    if ids.ndim != 1 or not (ids.dtype.kind in "iu" or ids.size == 0):
        raise ValueError(
            f"{what}: `ids` must be a 1-D integer array. "
            f"Received: shape={ids.shape}, dtype={ids.dtype}")
    ids = ids.astype(np.int64)
    rows = np.asarray(rows, dtype=dtype)
    if rows.shape != (ids.size, dim):
        raise ValueError(
            f"{what}: `rows` must have shape [len(ids), output_dim] = [{ids.size}, {dim}]. "
            f"Received: shape={rows.shape}")
    if np.unique(ids).size != ids.size:
        raise ValueError(f"{what}: `ids` must be distinct. Received {ids.size} ids with repeats")
    if input_dim is not None and ids.size and (ids.min() < 0 or ids.max() >= input_dim):
        raise ValueError(
            f"{what}: `ids` must lie in [0, input_dim={input_dim}). "
            f"Received: min={ids.min()}, max={ids.max()}")
    if default_row is None:
        default_row = np.zeros(dim, dtype)
    default_row = np.asarray(default_row, dtype=dtype)
    if default_row.shape != (dim,):
        raise ValueError(
            f"{what}: `default_row` must have shape [{dim}]. Received: shape={default_row.shape}")
    return ids, rows, default_row


def segments(inputs):
    """Flat raw ids, their segment (output row), the number of segments, and a function
    reshaping `[num_segments, dim]` combined vectors to the output's shape."""
    if isinstance(inputs, tf.RaggedTensor):
        if inputs.flat_values.shape.rank != 1:
            raise ValueError(
                "Ragged ids must be ragged in their last axis. "
                f"Received: shape={inputs.shape}")
        partitions = inputs.nested_row_splits
        segments = inputs.nested_value_rowids()[-1]
        num_segments = tf.shape(partitions[-1], out_type=tf.int64)[0] - 1

        def finish(combined):
            if len(partitions) == 1:
                return combined
            return tf.RaggedTensor.from_nested_row_splits(combined, partitions[:-1])

        return inputs.flat_values, segments, num_segments, finish

    if isinstance(inputs, tf.SparseTensor):
        dense_shape = inputs.dense_shape
        rank = inputs.shape.rank
        if rank == 1:
            return inputs.values, inputs.indices[:, 0], dense_shape[0], lambda c: c
        outer_shape = dense_shape[:-1]
        # Row-major position of each entry's outer index.
        strides = tf.math.cumprod(outer_shape, exclusive=True, reverse=True)
        segments = tf.reduce_sum(inputs.indices[:, :-1] * strides, axis=1)
        num_segments = tf.reduce_prod(outer_shape)

        def finish(combined):
            combined = tf.reshape(combined, tf.concat([outer_shape, [-1]], 0))
            combined.set_shape([None] * (rank - 1) + [combined.shape[-1]])
            return combined

        return inputs.values, segments, num_segments, finish

    inputs = tf.convert_to_tensor(inputs)
    if inputs.shape.rank == 1:
        size = tf.shape(inputs, out_type=tf.int64)[0]
        return inputs, tf.range(size), size, lambda c: c
    outer_shape = tf.shape(inputs, out_type=tf.int64)[:-1]
    width = tf.shape(inputs, out_type=tf.int64)[-1]
    num_segments = tf.reduce_prod(outer_shape)
    segments = tf.range(num_segments * width) // width
    static_outer = inputs.shape[:-1]

    def finish(combined):
        combined = tf.reshape(combined, tf.concat([outer_shape, [-1]], 0))
        combined.set_shape(static_outer.concatenate([combined.shape[-1]]))
        return combined

    return tf.reshape(inputs, [-1]), segments, num_segments, finish
