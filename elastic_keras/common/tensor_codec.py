"""Tensors to and from the wire format (`elastic_keras.proto.Tensor`).

A tensor travels as raw little-endian bytes in row-major order plus its dtype and shape. A
sparse tensor (a `tf.IndexedSlices`, or rows of an embedding table) also carries the int64
ids of its rows and the dense shape of the whole tensor. Decoding checks everything a peer
could get wrong and raises `PayloadError` before any value is used.

Example:

    >>> import numpy as np
    >>> wire = encode("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> decode(wire).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

from typing import NamedTuple

import ml_dtypes
import numpy as np

from elastic_keras.common.errors import PayloadError
from elastic_keras.proto import tensor_pb2

_TO_WIRE = {
    np.dtype(np.float16): tensor_pb2.DT_FLOAT16,
    np.dtype(ml_dtypes.bfloat16): tensor_pb2.DT_BFLOAT16,
    np.dtype(np.float32): tensor_pb2.DT_FLOAT32,
    np.dtype(np.float64): tensor_pb2.DT_FLOAT64,
    np.dtype(np.int32): tensor_pb2.DT_INT32,
    np.dtype(np.int64): tensor_pb2.DT_INT64,
}
_FROM_WIRE = {wire: dtype.newbyteorder("<") for dtype, wire in _TO_WIRE.items()}


class Slices(NamedTuple):
    """Rows of a sparse tensor: `values[i]` is row `ids[i]` of a tensor of `dense_shape`.

    `dense_shape[0]` is 0 for a table without a bound on its ids; its ids may then be any
    int64, negative ones included.
    """

    values: np.ndarray
    ids: np.ndarray
    dense_shape: tuple


def wire_dtype(dtype):
    """The wire enum of a numpy dtype; PayloadError for a dtype the wire does not carry."""
    dtype = np.dtype(dtype)
    try:
        return _TO_WIRE[dtype.newbyteorder("=")]
    except KeyError:
        raise PayloadError(
            "Tensor dtype must be one of float16, bfloat16, float32, float64, int32, int64. "
            f"Received: dtype={dtype}"
        ) from None


def _to_numpy(value):
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy"):
        return value.numpy()
    return np.asarray(value)


def _raw(array):
    array = np.asarray(array)
    little = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=little).tobytes()


def encode(name, value):
    """Encodes a dense tensor, or a `tf.IndexedSlices`/`Slices` as a sparse one.

    Args:
        name: the variable's name, carried in the message.
        value: a numpy array, TF tensor or variable, `tf.IndexedSlices` or `Slices`.

    Raises:
        PayloadError: the dtype cannot travel.
    """
    if isinstance(value, Slices):
        return encode_slices(name, value.values, value.ids, value.dense_shape)
    if hasattr(value, "indices") and hasattr(value, "values"):  # tf.IndexedSlices
        dense_shape = () if value.dense_shape is None else _to_numpy(value.dense_shape)
        return encode_slices(
            name, _to_numpy(value.values), _to_numpy(value.indices), tuple(dense_shape)
        )
    array = _to_numpy(value)
    return tensor_pb2.Tensor(
        name=name, dtype=wire_dtype(array.dtype), shape=array.shape, content=_raw(array)
    )


def encode_slices(name, values, ids, dense_shape):
    """Encodes rows `values` with row ids `ids` of a tensor of shape `dense_shape`."""
    values = _to_numpy(values)
    ids = _to_numpy(ids).astype(np.int64, copy=False).reshape(-1)
    return tensor_pb2.Tensor(
        name=name,
        dtype=wire_dtype(values.dtype),
        shape=values.shape,
        content=_raw(values),
        ids=ids.astype("<i8", copy=False).tobytes(),
        dense_shape=[int(d) for d in dense_shape],
    )


def _check(condition, tensor, rule, received):
    if not condition:
        raise PayloadError(f"Tensor {tensor.name!r}: {rule}. Received: {received}")


def decode(tensor):
    """Decodes a wire tensor: a numpy array when dense, `Slices` when it carries ids.

    The array is a read-only view of the message's bytes; copy it before writing to it.

    Raises:
        PayloadError: unknown dtype, negative dimension, content size not matching dtype and
            shape, or ids not matching the rows or outside the dense shape.
    """
    dtype = _FROM_WIRE.get(tensor.dtype)
    _check(dtype is not None, tensor, "unknown dtype", f"dtype={tensor.dtype}")
    shape = tuple(tensor.shape)
    _check(all(d >= 0 for d in shape), tensor, "dimensions must be >= 0", f"shape={shape}")
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    _check(
        len(tensor.content) == expected,
        tensor,
        f"content must hold {expected} bytes for dtype {dtype.name} and shape {shape}",
        f"{len(tensor.content)} bytes",
    )
    array = np.frombuffer(tensor.content, dtype=dtype).reshape(shape)
    if not tensor.dense_shape:
        _check(not tensor.ids, tensor, "ids need a dense_shape", f"{len(tensor.ids)} id bytes")
        return array
    _check(len(tensor.ids) % 8 == 0, tensor, "ids must be whole int64 values",
           f"{len(tensor.ids)} bytes")
    ids = np.frombuffer(tensor.ids, dtype="<i8")
    dense_shape = tuple(tensor.dense_shape)
    _check(len(shape) >= 1 and shape[0] == len(ids), tensor,
           "a sparse tensor needs one id per row", f"{len(ids)} ids for shape {shape}")
    _check(len(dense_shape) == len(shape) and dense_shape[1:] == shape[1:], tensor,
           f"dense_shape must be [rows, {', '.join(map(str, shape[1:]))}]",
           f"dense_shape={dense_shape}")
    if len(ids) and dense_shape[0] > 0:
        _check(ids.min() >= 0, tensor, "ids must be >= 0", f"min id {ids.min()}")
        _check(ids.max() < dense_shape[0], tensor, f"ids must be < {dense_shape[0]}",
               f"max id {ids.max()}")
    return Slices(array, ids, dense_shape)
