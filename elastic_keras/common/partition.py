"""Which parameter-server shard owns what: pure functions of names and the shard count.

Any process computes them alone, so a worker, the master and a restored checkpoint agree on
the placement without asking anyone.
"""

import zlib

import numpy as np

from elastic_keras.common.hashing import mix64, table_seed


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


def embedding_shards(table, ids, num_ps):
    """The shard of each row id of `table`: a stable hash of (table, id), as an int array.

    Example:

        >>> embedding_shards("user", np.array([1, 2, 3]), 1).tolist()
        [0, 0, 0]
    """
    ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
    if num_ps == 1:  # every id's shard, without hashing
        return np.zeros(ids.shape, dtype=np.int64)
    mixed = ids ^ np.uint64(table_seed(table))
    mix64(mixed, out=mixed)
    return (mixed % np.uint64(num_ps)).astype(np.int64)
