"""CSV files with a header line: a record is one data line, found by a line-offset index."""

import csv

import numpy as np

from elastic_keras.common.errors import DataError
from elastic_keras.data.api import RecordReader

_NEWLINE, _CR = 0x0A, 0x0D
_SCAN_BLOCK = 16 << 20
_READ_BLOCK = 4 << 20


class CSVReader(RecordReader):
    """Reads CSV files whose first line is a header of column names.

    A record is one data line as bytes, without its line ending (`\\n` or `\\r\\n`); record 0
    is the first line after the header. Empty lines (anywhere after the header) are not
    records, and the last line may lack a final newline. The header is parsed with the `csv`
    module (UTF-8, an optional byte-order mark is dropped) into `metadata.column_names`.

    Quoted fields that contain a line break are not supported: every line is a record.

    Args:
        path: the `.csv` file.
        index_cache_dir: where the index goes when the file's directory is not writable.

    Raises:
        DataError: the header is empty, has an empty column name, or repeats a column name.

    Example:

        >>> reader = CSVReader("train.csv")  # doctest: +SKIP
        >>> reader.metadata.column_names  # doctest: +SKIP
        ('age', 'income')
        >>> reader.read(0, 1)[0]  # doctest: +SKIP
        b'39,<=50K'
    """

    FORMAT = "csv"

    def _read_column_names(self):
        with open(self._path, "rb") as f:
            line = f.readline()
        self._header_end = len(line)
        text = line.decode("utf-8-sig", errors="replace").rstrip("\r\n")
        fields = next(csv.reader([text], skipinitialspace=True), [])
        names = tuple(name.strip() for name in fields)
        if not any(names):
            raise DataError(
                f"The first line of a CSV record file must be a header of column names, but "
                f"{self._path} starts with an empty line. Received: {text!r}"
            )
        if "" in names:
            raise DataError(
                f"Every column of the CSV header of {self._path} needs a name; column "
                f"{names.index('')} has none. Received: {text!r}"
            )
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise DataError(
                f"Column names in the CSV header of {self._path} must be unique; "
                f"{', '.join(repeated)} repeat. Received: {text!r}"
            )
        return names

    def describe_record(self, record):
        """Also gives the record's line in the file (1-based; the header is line 1)."""
        end = int(self._offsets[min(max(record, 0), self.num_records)])
        lines = 1  # the record's own line
        with open(self._path, "rb") as f:
            position = 0
            while position < end:
                block = f.read(min(_SCAN_BLOCK, end - position))
                if not block:
                    break
                lines += block.count(b"\n")
                position += len(block)
        return f"{super().describe_record(record)} (line {lines})"

    def _scan(self, file, file_size):
        newlines, cr_before = _find_newlines(file, self._header_end)
        if file_size > (int(newlines[-1]) + 1 if len(newlines) else self._header_end):
            # The last line has no final newline: treat the end of the file as its end.
            file.seek(file_size - 1)
            newlines = np.append(newlines, file_size)
            cr_before = np.append(cr_before, file.read(1)[0] == _CR)
        if not len(newlines):
            return np.array([self._header_end], dtype=np.int64)
        starts = np.concatenate(([self._header_end], newlines[:-1] + 1))
        lengths = newlines - starts
        kept = ~((lengths == 0) | ((lengths == 1) & cr_before))
        end = min(int(newlines[kept][-1]) + 1, file_size) if kept.any() else self._header_end
        return np.append(starts[kept], end)

    def _read_records(self, file, start, end):
        offsets = self._offsets
        first = start
        while first < end:
            last = self._block_end(first, end, _READ_BLOCK)
            bounds = (offsets[first:last + 1] - offsets[first]).tolist()
            block = file.read(bounds[-1])
            if len(block) < bounds[-1]:
                raise DataError(
                    f"Records [{first}, {last}) of {self._path} are truncated: the file is "
                    "shorter than its index (it changed while being read). Received: "
                    f"{len(block)} of {bounds[-1]} bytes"
                )
            yield [_line(block, line_start, next_start)
                   for line_start, next_start in zip(bounds[:-1], bounds[1:])]
            first = last


def _line(block, start, next_start):
    """The line of `block` from `start`, without its ending (the next line is at
    `next_start`)."""
    end = block.find(b"\n", start, next_start)
    if end < 0:
        end = next_start
    if end > start and block[end - 1] == _CR:
        end -= 1
    return block[start:end]


def _find_newlines(file, start):
    """Positions of every `\\n` from `start` on, and whether a `\\r` comes just before each."""
    file.seek(start)
    position, previous = start, -1
    newlines, cr_before = [], []
    while block := file.read(_SCAN_BLOCK):
        data = np.frombuffer(block, dtype=np.uint8)
        found = np.flatnonzero(data == _NEWLINE)
        before = data[np.maximum(found - 1, 0)] == _CR
        if len(found) and found[0] == 0:
            before[0] = previous == _CR
        newlines.append(found + position)
        cr_before.append(before)
        position, previous = position + len(block), int(data[-1])
    if not newlines:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    return np.concatenate(newlines).astype(np.int64), np.concatenate(cr_before)
