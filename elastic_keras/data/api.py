"""The record-reader interface: what every record format offers to the worker and master.

Implementations live beside this module (`tfrecord.py`, `csv_reader.py`); `reader.py` picks
one by file extension.
"""

import abc
import dataclasses
import operator
import os
from typing import BinaryIO, ClassVar, Iterator

import numpy as np

from elastic_keras.common.errors import DataError
from elastic_keras.data.index import load_or_build_index


@dataclasses.dataclass(frozen=True)
class Metadata:
    """What a model's `dataset_fn(dataset, mode, metadata)` knows about the records it gets.

    The dataset handed to `dataset_fn` yields raw records as scalar `tf.string` tensors: for
    TFRecord files, the serialized payload of each record (usually a `tf.train.Example`, to
    parse with `tf.io.parse_example`); for CSV files, one data line without its line ending
    (to split with `tf.io.decode_csv`, in the order of `column_names`).

    Attributes:
        path: the record file the records come from.
        format: `"tfrecord"` or `"csv"`.
        num_records: how many records the file holds (the CSV header is not a record).
        column_names: the CSV header's column names, in file order; empty for TFRecord.

    Example:

        >>> def dataset_fn(dataset, mode, metadata):
        ...     if metadata.format == "csv":
        ...         defaults = [[0.0]] * (len(metadata.column_names) - 1) + [[0]]
        ...         dataset = dataset.map(lambda line: tf.io.decode_csv(line, defaults))
        ...     return dataset
    """

    path: str
    format: str
    num_records: int
    column_names: tuple[str, ...] = ()


class RecordReader(abc.ABC):
    """Reads ranges of records from one file, seeking straight to the first one.

    A reader indexes its file on construction (or reuses the stored index, see `index.py`),
    so `num_records` is known at once and `read(start, end)` does not scan from the start.
    Subclasses name their `FORMAT` and implement `_scan` (build the offsets) and
    `_read_records` (decode records from a file positioned at the first one).

    Args:
        path: the record file.
        index_cache_dir: where the index goes when the file's directory is not writable;
            default `~/.cache/elastic_keras/index`.

    Raises:
        DataError: the file cannot be read, or is malformed.
    """

    FORMAT: ClassVar[str]
    _READ_BUFFER = 1 << 20

    def __init__(self, path, index_cache_dir=""):
        self._path = os.fspath(path)
        try:
            column_names = self._read_column_names()
            self._offsets = load_or_build_index(
                self._path, self.FORMAT, self._scan, index_cache_dir
            )
        except OSError as exc:
            raise DataError(
                f"Cannot read the record file {self._path}: {exc.strerror or exc}. "
                f"Received: path={self._path!r}"
            ) from exc
        self._metadata = Metadata(
            path=self._path,
            format=self.FORMAT,
            num_records=len(self._offsets) - 1,
            column_names=column_names,
        )

    @property
    def metadata(self) -> Metadata:
        """The file's `Metadata`, as handed to a model's `dataset_fn`."""
        return self._metadata

    @property
    def num_records(self) -> int:
        """How many records the file holds."""
        return self._metadata.num_records

    @property
    def path(self) -> str:
        """The record file."""
        return self._path

    def read(self, start, end) -> list[bytes]:
        """Records `start` (inclusive) to `end` (exclusive), in file order.

        Args:
            start: the first record, 0-based.
            end: one past the last record; at most `num_records`.

        Raises:
            DataError: the range is not within `[0, num_records]`, or a record is corrupt or
                truncated (the first such record is named).
        """
        start, end = operator.index(start), operator.index(end)
        if not 0 <= start <= end <= self.num_records:
            raise DataError(
                f"Records [{start}, {end}) are outside {self._path}, which holds records "
                f"[0, {self.num_records}). Received: start={start}, end={end}"
            )
        records = []
        if start == end:
            return records
        try:
            with open(self._path, "rb", buffering=self._READ_BUFFER) as f:
                f.seek(int(self._offsets[start]))
                for block in self._read_records(f, start, end):
                    records += block
        except OSError as exc:
            raise DataError(
                f"Cannot read records [{start}, {end}) of {self._path}: "
                f"{exc.strerror or exc}. Received: path={self._path!r}"
            ) from exc
        return records

    def _block_end(self, first, end, size):
        """The record after the last of a block read from record `first`: about `size`
        bytes of whole records, at least one, none past `end`."""
        offsets = self._offsets
        last = int(np.searchsorted(offsets, offsets[first] + size, side="right")) - 1
        return min(max(last, first + 1), end)

    def describe_record(self, record) -> str:
        """Record `record` (its 0-based index in the file) in words, for error messages:
        "record 7 of data/train.csv (line 9)" for CSV, "record 7 of data/a.tfrecord"."""
        return f"record {record} of {self._path}"

    def _read_column_names(self) -> tuple[str, ...]:
        """The file's column names, read before indexing; none by default."""
        return ()

    @abc.abstractmethod
    def _scan(self, file: BinaryIO, file_size: int) -> np.ndarray:
        """Returns the `num_records + 1` offsets of the open file (see `index.py`)."""

    @abc.abstractmethod
    def _read_records(self, file: BinaryIO, start: int, end: int) -> Iterator[list[bytes]]:
        """Yields records `[start, end)` from `file`, which is positioned at record `start`,
        as lists of consecutive records (a list per block read)."""
