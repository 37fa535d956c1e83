"""Stable 64-bit hashing shared by shard placement, id maps and embedding initialisation.

Every process must compute the same numbers for the same table names and ids, whatever its
platform, so these are fixed functions of their inputs (no seed, no `hash()`).

Example:

    >>> import numpy as np
    >>> mix64(np.array([0, 1], dtype=np.uint64)).tolist()
    [16294208416658607535, 10451216379200822465]
"""

import hashlib

import numpy as np

_U64 = np.uint64


def mix64(values, out=None):
    """SplitMix64's finaliser over a uint64 array: a fast, well-spread, stable bit mixer.

    Args:
        values: a uint64 array.
        out: where to write the result; `values` itself mixes in place (the fastest).
            None: a new array.
    """
    z = np.array(values, dtype=_U64) if out is None else out
    if out is not None and out is not values:
        z[...] = values
    # Arithmetic on integer arrays wraps around silently (only numpy scalars warn).
    z += _U64(0x9E3779B97F4A7C15)
    z ^= z >> _U64(30)
    z *= _U64(0xBF58476D1CE4E5B9)
    z ^= z >> _U64(27)
    z *= _U64(0x94D049BB133111EB)
    z ^= z >> _U64(31)
    return z


def table_seed(table):
    """A stable 64-bit number for an embedding table's name."""
    return int.from_bytes(hashlib.blake2b(table.encode("utf-8"), digest_size=8).digest(), "little")
