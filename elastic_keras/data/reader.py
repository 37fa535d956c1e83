"""Opening a record file: the one place that maps file extensions to record readers.

Example:

    >>> reader = open_reader("data/train-00000.tfrecord")  # doctest: +SKIP
    >>> reader.metadata.num_records  # doctest: +SKIP
    5000
"""

import os

from elastic_keras.common.errors import DataError
from elastic_keras.data.api import Metadata, RecordReader
from elastic_keras.data.csv_reader import CSVReader
from elastic_keras.data.tfrecord import TFRecordReader

__all__ = ["Metadata", "RecordReader", "open_reader", "reader_class", "is_record_file"]

READERS: dict[str, type[RecordReader]] = {
    ".tfrecord": TFRecordReader,
    ".tfrecords": TFRecordReader,
    ".rec": TFRecordReader,
    ".tfr": TFRecordReader,
    ".csv": CSVReader,
}

_COMPRESSED = (".gz", ".gzip", ".zlib", ".bz2", ".xz", ".zip", ".zst")


def _extension(path):
    return os.path.splitext(os.fspath(path))[1].lower()


def is_record_file(path):
    """Whether `path` has the extension of a record format that training reads."""
    return _extension(path) in READERS


def reader_class(path):
    """The `RecordReader` subclass for `path`, chosen by its extension.

    Args:
        path: a record file name.

    Raises:
        DataError: the extension is not one of a training format (compressed files get a
            hint to convert them with `elastic-keras data`).
    """
    extension = _extension(path)
    if extension in READERS:
        return READERS[extension]
    accepted = ", ".join(READERS)
    if extension in _COMPRESSED:
        raise DataError(
            f"Training reads uncompressed record files ({accepted}), not compressed ones; "
            f"convert it first, e.g. `elastic-keras data {path} --output DIR`. "
            f"Received: {os.fspath(path)!r}"
        )
    raise DataError(
        f"A record file must end with one of {accepted}. Received: {os.fspath(path)!r}"
    )


def open_reader(path, index_cache_dir="") -> RecordReader:
    """Opens `path` with the reader for its extension, building or reusing its index.

    Args:
        path: a `.tfrecord`, `.tfrecords`, `.rec`, `.tfr` or `.csv` file.
        index_cache_dir: where the index goes when the file's directory is not writable;
            default `~/.cache/elastic_keras/index`.

    Returns:
        A `RecordReader`.

    Raises:
        DataError: the extension is not a training format, or the file cannot be read or is
            malformed.
    """
    return reader_class(path)(path, index_cache_dir=index_cache_dir)
