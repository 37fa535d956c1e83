"""Which parameter-server shard owns what: pure functions of names and the shard count.

Any process computes them alone, so a worker, the master and a restored checkpoint agree on
the placement without asking anyone.
"""

import hashlib
import zlib

import numpy as np


def dense_shard(name, num_ps):
    """The shard that holds the dense variable `name`: a stable hash of the name.

    Example:

        >>> dense_shard("dense/kernel", 1)
        0
    """
    return zlib.crc32(name.encode("utf-8")) % num_ps


def split_dense(named_values, num_ps):
    """Splits `{name: value}` into one dict per shard, in shard order."""
    shards = [{} for _ in range(num_ps)]
    for name, value in named_values.items():
        shards[dense_shard(name, num_ps)][name] = value
    return shards


_MASK64 = (1 << 64) - 1


def _mix64(values):
    """SplitMix64's finaliser over a uint64 array: a fast, well-spread, stable bit mixer."""
    with np.errstate(over="ignore"):
        z = values + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def table_seed(table):
    """A stable 64-bit number for an embedding table's name."""
    return int.from_bytes(hashlib.blake2b(table.encode("utf-8"), digest_size=8).digest(), "little")


def embedding_shards(table, ids, num_ps):
    """The shard of each row id of `table`: a stable hash of (table, id), as an int array.

    Example:

        >>> embedding_shards("user", np.array([1, 2, 3]), 1).tolist()
        [0, 0, 0]
    """
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if num_ps == 1:  # every id's shard, without hashing
        return np.zeros(ids.shape, dtype=np.int64)
    mixed = _mix64(ids ^ np.uint64(table_seed(table) & _MASK64))
    return (mixed % np.uint64(num_ps)).astype(np.int64)
