"""Tensors to and from the wire format (`elastic_keras.proto.Tensor`).

A tensor travels as raw little-endian bytes in row-major order plus its dtype and shape. A
sparse tensor (a `tf.IndexedSlices`, or rows of an embedding table) also carries the int64
ids of its rows and the dense shape of the whole tensor. Decoding checks everything a peer
could get wrong and raises `PayloadError` before any value is used.

`encode` builds a `Tensor` message. `wire_tensor` gives the same fields as a `WireTensor`
whose bytes are views of the arrays, without copying them: what a chunked stream sends
(`chunking.split_tensors`) and gives back (`joining.TensorJoiner`), since
every write or read of a message's bytes field copies the bytes. `decode` reads either.

Example:

    >>> import numpy as np
    >>> wire = encode("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    >>> decode(wire).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
"""

import math
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
# No tensor is larger (1 TiB): a shape announcing more is malformed, whatever its bytes.
MAX_TENSOR_BYTES = 1 << 40


class WireTensor(NamedTuple):
    """The fields of a wire `Tensor`, with `content` and `ids` as byte buffers (a `memoryview`
    of the arrays, `bytes` or `bytearray`) instead of copies held by a message."""

    name: str
    dtype: int
    shape: tuple
    content: object
    ids: object = b""
    dense_shape: tuple = ()


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


def _raw(array, dtype=None):
    """A flat byte view of `array` as contiguous little-endian `dtype`; copies only if it is
    not already laid out so."""
    array = np.asarray(array)
    little = np.dtype(dtype or array.dtype).newbyteorder("<")
    return memoryview(np.ascontiguousarray(array, dtype=little).reshape(-1).view(np.uint8))


def as_numpy(value):
    """`value` as a numpy array, or as `Slices` of numpy arrays when it is sparse.

    Args:
        value: a numpy array (or array-like), TF tensor or variable, `tf.IndexedSlices` or
            `Slices`.
    """
    if isinstance(value, Slices):
        return value
    if hasattr(value, "indices") and hasattr(value, "values"):  # tf.IndexedSlices
        dense_shape = () if value.dense_shape is None else _to_numpy(value.dense_shape)
        return Slices(_to_numpy(value.values), _to_numpy(value.indices), tuple(dense_shape))
    return _to_numpy(value)


def wire_tensor(name, value):
    """Like `encode`, a `WireTensor` whose bytes are views of `value`'s arrays (no copy when
    they are contiguous little-endian). Keep `value` unchanged while the result is in use.

    Raises:
        PayloadError: the dtype cannot travel.
    """
    value = as_numpy(value)
    if isinstance(value, Slices):
        return _wire_slices(name, value.values, value.ids, value.dense_shape)
    return WireTensor(name, wire_dtype(value.dtype), tuple(value.shape), _raw(value))


def _wire_slices(name, values, ids, dense_shape):
    values = _to_numpy(values)
    return WireTensor(
        name, wire_dtype(values.dtype), tuple(values.shape), _raw(values),
        ids=_raw(_to_numpy(ids).reshape(-1), np.int64),
        dense_shape=tuple(int(d) for d in dense_shape),
    )


def to_message(wire):
    """The `Tensor` message of a `WireTensor` (copies its bytes into the message)."""
    return tensor_pb2.Tensor(
        name=wire.name, dtype=wire.dtype, shape=wire.shape, content=bytes(wire.content),
        ids=bytes(wire.ids), dense_shape=wire.dense_shape,
    )


def encode(name, value):
    """Encodes a dense tensor, or a `tf.IndexedSlices`/`Slices` as a sparse one.

    Args:
        name: the variable's name, carried in the message.
        value: a numpy array, TF tensor or variable, `tf.IndexedSlices` or `Slices`.

    Raises:
        PayloadError: the dtype cannot travel.
    """
    return to_message(wire_tensor(name, value))


def encode_slices(name, values, ids, dense_shape):
    """Encodes rows `values` with row ids `ids` of a tensor of shape `dense_shape`."""
    return to_message(_wire_slices(name, values, ids, dense_shape))


def _check(condition, tensor, rule, received):
    if not condition:
        raise PayloadError(f"Tensor {tensor.name!r}: {rule}. Received: {received}")


def _content_layout(tensor):
    dtype = _FROM_WIRE.get(tensor.dtype)
    _check(dtype is not None, tensor, "unknown dtype: it must be one of the wire's "
           f"{sorted(_FROM_WIRE)}", f"dtype={tensor.dtype}")
    shape = tuple(tensor.shape)
    _check(all(d >= 0 for d in shape), tensor, "dimensions must be >= 0", f"shape={shape}")
    # Python integers: no overflow. Zero dimensions aside, so numpy can lay the shape out.
    _check(math.prod(max(d, 1) for d in shape) * dtype.itemsize <= MAX_TENSOR_BYTES, tensor,
           f"a tensor may hold at most {MAX_TENSOR_BYTES} bytes (its dimensions other than 0 "
           "multiplied)", f"shape={shape}")
    return dtype, shape, math.prod(shape) * dtype.itemsize


def byte_sizes(tensor):
    """(content bytes, ids bytes) that a tensor with the dtype, shape and dense_shape of
    `tensor` (a `Tensor`, `WireTensor` or `transfer_pb2.TensorHeader`) must hold.

    Raises:
        PayloadError: unknown dtype, negative dimension, or more than `MAX_TENSOR_BYTES`.
    """
    _, shape, content = _content_layout(tensor)
    return content, (shape[0] * 8 if tensor.dense_shape and shape else 0)


def decode(tensor):
    """Decodes a wire tensor (a `Tensor` or `WireTensor`): a numpy array when dense, `Slices`
    when it carries ids.

    The array is a view of the tensor's bytes (read-only for a message); copy it before
    writing to it.

    Raises:
        PayloadError: unknown dtype, negative dimension, a shape of more than
            `MAX_TENSOR_BYTES`, content size not matching dtype and shape, or ids not
            matching the rows or outside the dense shape.
    """
    dtype, shape, expected = _content_layout(tensor)
    # Each read of a message's bytes field copies them: read each field once.
    content, id_bytes = tensor.content, tensor.ids
    _check(
        len(content) == expected,
        tensor,
        f"content must hold {expected} bytes for dtype {dtype.name} and shape {shape}",
        f"{len(content)} bytes",
    )
    array = np.frombuffer(content, dtype=dtype).reshape(shape)
    if not tensor.dense_shape:
        _check(not id_bytes, tensor, "ids need a dense_shape", f"{len(id_bytes)} id bytes")
        return array
    _check(len(id_bytes) % 8 == 0, tensor, "ids must be whole int64 values",
           f"{len(id_bytes)} bytes")
    ids = np.frombuffer(id_bytes, dtype="<i8")
    dense_shape = tuple(tensor.dense_shape)
    _check(len(shape) >= 1 and shape[0] == len(ids), tensor,
           "a sparse tensor needs one id per row", f"{len(ids)} ids for shape {shape}")
    _check(len(dense_shape) == len(shape) and dense_shape[1:] == shape[1:], tensor,
           f"dense_shape must be [rows, {', '.join(map(str, shape[1:]))}]",
           f"dense_shape={dense_shape}")
    _check(dense_shape[0] >= 0, tensor, "dense_shape[0] must be >= 0 (0: ids unbounded)",
           f"dense_shape={dense_shape}")
    if len(ids) and dense_shape[0] > 0:
        _check(ids.min() >= 0, tensor, "ids must be >= 0", f"min id {ids.min()}")
        _check(ids.max() < dense_shape[0], tensor, f"ids must be < {dense_shape[0]}",
               f"max id {ids.max()}")
    return Slices(array, ids, dense_shape)
