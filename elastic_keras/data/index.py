"""The sidecar offset index of a record file: built once, reused until the file changes.

An index holds `num_records + 1` byte offsets as int64: where each record starts, then where
the last one ends. It is stored beside the data file as `<file>.index` when that directory is
writable, otherwise in a cache folder under a name made from a hash of the file's real path.
The index records the data file's size and modification time; when either changes, the index
is rebuilt. An index file that is short, corrupt or of another format is rebuilt, not
trusted. Indexes are written atomically, so several workers that build the same index at the
same time never see a partial one.

File layout (little-endian): a 56-byte header (magic, format name, data file size, data file
mtime in ns, number of offsets, CRC32C of the offsets) followed by the offsets.

Example:

    >>> offsets = load_or_build_index("train.tfrecord", "tfrecord", scan)  # doctest: +SKIP
    >>> num_records = len(offsets) - 1  # doctest: +SKIP
"""

import hashlib
import logging
import os
import struct
from typing import BinaryIO, Callable

import google_crc32c
import numpy as np

from elastic_keras.common.atomic_file import atomic_write

logger = logging.getLogger(__name__)

INDEX_SUFFIX = ".index"
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "elastic_keras", "index")

_MAGIC = b"EKIDX\x00\x01\x00"
_HEADER = struct.Struct("<8s16sQqQI4x")
_OFFSET_DTYPE = np.dtype("<i8")

# Scans an open data file of the given size and returns its offsets (see the module docstring).
Scanner = Callable[[BinaryIO, int], np.ndarray]


def load_or_build_index(path, format, scan, index_cache_dir=""):
    """Returns the offsets of `path`, from its stored index or by scanning the file.

    A stored index is used only if it was built for this format from a file of the same size
    and modification time. Otherwise `scan` runs once and its result is saved beside the file,
    or in the cache folder when that fails; if neither can be written the offsets are still
    returned and a warning is logged.

    Args:
        path: the data file.
        format: the record format's name (e.g. `"tfrecord"`), stored in the index so that an
            index of another format is never trusted.
        scan: `scan(file, file_size) -> offsets` builds the index from the open data file.
        index_cache_dir: where indexes go when the data directory is not writable;
            default `~/.cache/elastic_keras/index`.

    Returns:
        A read-only int64 array of `num_records + 1` offsets.

    Raises:
        OSError: the data file cannot be read.
        DataError: whatever `scan` raises for a malformed file.
    """
    stat = os.stat(path)
    locations = index_locations(path, index_cache_dir)
    for location in locations:
        offsets = _load(location, format, stat)
        if offsets is not None:
            return offsets
    with open(path, "rb") as f:
        offsets = np.ascontiguousarray(scan(f, stat.st_size), dtype=_OFFSET_DTYPE)
    _save(offsets, format, stat, locations)
    offsets.flags.writeable = False
    return offsets


def index_locations(path, index_cache_dir=""):
    """Where the index of `path` may live, in the order they are tried.

    Args:
        path: the data file.
        index_cache_dir: the cache folder; default `~/.cache/elastic_keras/index`.

    Returns:
        `[beside, cached]`: `<path>.index`, then a file in the cache folder named by a hash
        of the real path of `path`.
    """
    real = os.path.realpath(path)
    digest = hashlib.sha256(real.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    cache_dir = os.path.expanduser(index_cache_dir or DEFAULT_CACHE_DIR)
    cached = os.path.join(cache_dir, f"{digest}-{os.path.basename(real)[:100]}{INDEX_SUFFIX}")
    return [os.fspath(path) + INDEX_SUFFIX, cached]


def _load(location, format, stat):
    """The offsets stored at `location`, or None when absent, stale or not to be trusted."""
    try:
        with open(location, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if len(data) < _HEADER.size:
        return _distrust(location, "shorter than its header")
    magic, stored_format, size, mtime_ns, count, crc = _HEADER.unpack_from(data)
    if magic != _MAGIC or stored_format.rstrip(b"\x00") != format.encode():
        return _distrust(location, "not an index of this format")
    if (size, mtime_ns) != (stat.st_size, stat.st_mtime_ns):
        return None  # The data file changed since the index was built.
    body = data[_HEADER.size:]
    if len(body) != count * _OFFSET_DTYPE.itemsize or count < 1:
        return _distrust(location, "truncated")
    if google_crc32c.value(body) != crc:
        return _distrust(location, "checksum mismatch")
    offsets = np.frombuffer(body, dtype=_OFFSET_DTYPE)
    if offsets[0] < 0 or offsets[-1] > size or np.any(np.diff(offsets) < 0):
        return _distrust(location, "offsets out of order")
    return offsets


def _distrust(location, reason):
    logger.warning("Ignoring index %s (%s); rebuilding it.", location, reason)
    return None


def _save(offsets, format, stat, locations):
    """Writes the index to the first location that accepts it."""
    body = offsets.tobytes()
    header = _HEADER.pack(
        _MAGIC, format.encode(), stat.st_size, stat.st_mtime_ns, len(offsets),
        google_crc32c.value(body),
    )
    failures = []
    for location in locations:
        directory = os.path.dirname(location)
        try:
            os.makedirs(directory, exist_ok=True)
            if not os.access(directory, os.W_OK):
                raise PermissionError(f"directory {directory} is not writable")
            with atomic_write(location) as f:
                f.write(header)
                f.write(body)
            return location
        except OSError as exc:
            failures.append(f"{location}: {exc}")
    logger.warning(
        "Could not store the index (%s); it will be rebuilt next time.", "; ".join(failures)
    )
    return None
