"""Reduced-precision transfer: floating tensors travel as float16 or bfloat16.

Gradients and pulled parameters may cross the wire at half their size while the parameter
server keeps and accumulates float32: the sender calls `to_transfer_dtype` before
`tensor_codec.encode`, the receiver `from_transfer_dtype` after `tensor_codec.decode`.
Integer tensors (ids, counters) are never touched.

Both casts round to nearest even. float16 keeps 11 significant bits (relative error at most
2**-11) but only the range 6.1e-5 .. 65504: larger magnitudes become inf and smaller ones
lose precision down to 6e-8, then 0. bfloat16 keeps float32's range with 8 significant bits
(relative error at most 2**-8).

Example:

    >>> import numpy as np
    >>> half = to_transfer_dtype(np.array([1.0, 1 / 3], np.float32), "bfloat16")
    >>> half.dtype.name, from_transfer_dtype(half).tolist()
    ('bfloat16', [1.0, 0.333984375])
"""

import ml_dtypes
import numpy as np

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.transfer.tensor_codec import Slices

TRANSFER_DTYPES = {"float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16)}
_FLOATING = frozenset(
    np.dtype(t) for t in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64)
)


def _is_floating(array):
    return array.dtype.newbyteorder("=") in _FLOATING


def _map_values(value, cast):
    if isinstance(value, Slices):
        return value._replace(values=cast(np.asarray(value.values)))
    return cast(np.asarray(value))


def to_transfer_dtype(value, transfer_dtype):
    """`value` with floating data cast to `transfer_dtype`; anything else unchanged.

    Args:
        value: a numpy array (or array-like) or `tensor_codec.Slices` (its values are cast).
        transfer_dtype: "float16", "bfloat16", or None (send as is).

    Raises:
        ConfigError: `transfer_dtype` is none of those.
    """
    if transfer_dtype is None:
        return value
    try:
        dtype = TRANSFER_DTYPES[transfer_dtype]
    except (KeyError, TypeError):
        raise ConfigError(
            f"transfer_dtype must be one of {', '.join(TRANSFER_DTYPES)} or None. "
            f"Received: transfer_dtype={transfer_dtype!r}"
        ) from None
    return _map_values(
        value, lambda array: array.astype(dtype, copy=False) if _is_floating(array) else array
    )


def from_transfer_dtype(value, dtype=np.float32):
    """`value` with floating data cast back to `dtype` (float32 by default); ints unchanged.

    A float32 array comes back as it is, without a copy.

    Args:
        value: a numpy array or `tensor_codec.Slices`, as decoded from the wire.
        dtype: the floating dtype the receiver keeps.

    Raises:
        ConfigError: `dtype` is not a floating dtype.
    """
    dtype = np.dtype(dtype)
    if dtype not in _FLOATING:
        raise ConfigError(
            f"dtype must be float16, bfloat16, float32 or float64. Received: dtype={dtype}"
        )
    return _map_values(
        value, lambda array: array.astype(dtype, copy=False) if _is_floating(array) else array
    )
