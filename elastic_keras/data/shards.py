"""The record files of a data set and how their records are cut into task ranges."""

import dataclasses
import logging

from elastic_keras.common.errors import ConfigError, DataError
from elastic_keras.data.paths import expand_paths
from elastic_keras.data.reader import open_reader

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One record file of a data set.

    Attributes:
        path: the file's absolute path.
        num_records: how many records it holds (more than zero).
    """

    path: str
    num_records: int


def list_shards(spec, index_cache_dir="", flag="--training-data"):
    """Lists the non-empty record files that `spec` names, indexing each one.

    Args:
        spec: a file, a directory or a glob (see `expand_paths`).
        index_cache_dir: where indexes go when a data directory is not writable.
        flag: the flag `spec` came from, for error messages.

    Returns:
        A list of `Shard`, sorted by path. Empty files are left out with a warning.

    Raises:
        DataError: `spec` matches no record file, a file is malformed, the files mix record
            formats, or they hold no records at all.

    Example:

        >>> [s.num_records for s in list_shards("data/train")]  # doctest: +SKIP
        [2500, 2500]
    """
    shards, formats = [], {}
    for path in expand_paths(spec, flag=flag):
        reader = open_reader(path, index_cache_dir=index_cache_dir)
        formats.setdefault(reader.metadata.format, path)
        if reader.num_records == 0:
            logger.warning("Skipping %s: it holds no records.", path)
            continue
        shards.append(Shard(path=path, num_records=reader.num_records))
    if len(formats) > 1:
        examples = ", ".join(f"{fmt} ({path})" for fmt, path in formats.items())
        raise DataError(
            f"{flag} must name files of one record format, since one dataset_fn reads them "
            f"all. Received: {examples}"
        )
    if not shards:
        raise DataError(f"{flag} names only empty record files. Received: {spec!r}")
    return shards


def split_range(num_records, records_per_task):
    """Cuts records `[0, num_records)` into consecutive ranges of `records_per_task` at most.

    Args:
        num_records: how many records to cover (zero or more).
        records_per_task: the largest range (one or more); the last range may be shorter.

    Returns:
        `[(start, end), ...]` in order, covering every record exactly once.

    Raises:
        ConfigError: `records_per_task` is below 1 or `num_records` is negative.

    Example:

        >>> split_range(10, 4)
        [(0, 4), (4, 8), (8, 10)]
    """
    if records_per_task < 1:
        raise ConfigError(
            f"records_per_task must be a positive integer. Received: {records_per_task!r}"
        )
    if num_records < 0:
        raise ConfigError(f"num_records must be zero or more. Received: {num_records!r}")
    return [
        (start, min(start + records_per_task, num_records))
        for start in range(0, num_records, records_per_task)
    ]
