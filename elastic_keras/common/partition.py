"""Which parameter-server shard owns what: pure functions of names and the shard count.

Any process computes them alone, so a worker, the master and a restored checkpoint agree on
the placement without asking anyone.
"""

import zlib


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
