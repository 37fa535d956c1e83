"""TFRecord files: a reader that seeks by offset index and checks every checksum, and a writer.

A TFRecord file is a sequence of records, each laid out as

    uint64 length | uint32 masked_crc32c(length) | data[length] | uint32 masked_crc32c(data)

with little-endian integers. This module reads and writes that format itself, without
TensorFlow, so workers and the master stay light; the files are the ones
`tf.data.TFRecordDataset` reads and `tf.io.TFRecordWriter` writes (uncompressed).
"""

import struct

import google_crc32c
import numpy as np

from elastic_keras.common.errors import DataError
from elastic_keras.data.api import RecordReader

_LENGTH = struct.Struct("<Q")
_HEADER = struct.Struct("<QI")
_CRC = struct.Struct("<I")
_OVERHEAD = _HEADER.size + _CRC.size
_MASK_DELTA = 0xA282EAD8
_SCAN_BLOCK = 1 << 20
_LARGE_RECORD = 1 << 16


def masked_crc(data):
    """The masked CRC32C that TFRecord stores for `data` (bytes-like)."""
    crc = google_crc32c.value(data if isinstance(data, bytes) else bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def _masked(crcs):
    """`masked_crc`'s masking of CRC32C values (a uint64 array), as uint32."""
    return ((((crcs >> 15) | (crcs << 17)) + _MASK_DELTA) & 0xFFFFFFFF).astype(np.uint32)


def _fields(raw, places, width):
    """The `width` bytes at each of `places` in the uint8 array `raw`: shape [n, width]."""
    return raw[places[:, None] + np.arange(width)]


class TFRecordReader(RecordReader):
    """Reads uncompressed TFRecord files; a record is the raw payload bytes.

    Indexing walks the record headers, skipping payloads, and checks each length's checksum.
    Reading seeks to the first record of the range and checks both checksums of every record.

    Args:
        path: the `.tfrecord` file.
        index_cache_dir: where the index goes when the file's directory is not writable.

    Raises:
        DataError: a record is corrupt (a checksum does not match) or the file is truncated;
            the message names the file, the record number and what failed.

    Example:

        >>> reader = TFRecordReader("train.tfrecord")  # doctest: +SKIP
        >>> first_ten = list(reader.read(0, 10))  # doctest: +SKIP
    """

    FORMAT = "tfrecord"

    def _scan(self, file, file_size):
        # Small records are parsed from large buffered blocks; after a large record the scan
        # seeks to the next header and reads only that, so payloads are mostly skipped.
        offsets = []
        position, buffer, buffer_start, length = 0, b"", 0, 0
        while position < file_size:
            relative = position - buffer_start
            if relative + _HEADER.size > len(buffer):
                file.seek(position)
                want = _HEADER.size if length > _LARGE_RECORD else _SCAN_BLOCK
                buffer, buffer_start, relative = file.read(want), position, 0
                if len(buffer) < _HEADER.size:
                    raise self._truncated(
                        len(offsets), f"the file ends {len(buffer)} bytes into the header",
                        position,
                    )
            length, length_crc = _HEADER.unpack_from(buffer, relative)
            self._check_length_crc(
                len(offsets), buffer[relative:relative + _LENGTH.size], length_crc
            )
            offsets.append(position)
            position += length + _OVERHEAD
        if position > file_size:
            raise self._truncated(
                len(offsets) - 1,
                f"its header says {length} bytes of data but the file ends "
                f"{position - file_size} bytes short",
                offsets[-1],
            )
        offsets.append(position)
        return np.array(offsets, dtype=np.int64)

    def _read_records(self, file, start, end):
        # The index gives every record's place: read a block of records at once and cut
        # them out of it (a call and a copy per block, not three reads per record).
        first = start
        while first < end:
            last = self._block_end(first, end, _SCAN_BLOCK)
            places = self._offsets[first:last + 1].tolist()
            yield self._cut(file.read(places[-1] - places[0]), places, first)
            first = last

    def _cut(self, block, offsets, record):
        """The records of `block`, which starts at `offsets[0]`; `offsets[i]` is the place of
        record `record + i` in the file, `offsets[-1]` the end of the last.

        Every field of every record is checked at once, over arrays; where any check fails,
        `_cut_one_by_one` finds the first record that fails and names it.
        """
        places = np.asarray(offsets, dtype=np.int64) - offsets[0]
        starts, ends = places[:-1], places[1:]
        if places[-1] != len(block):  # the file ends inside the block
            return self._cut_one_by_one(block, offsets, record)
        data = [block[start + _HEADER.size:end - _CRC.size]
                for start, end in zip(starts.tolist(), ends.tolist())]
        raw = np.frombuffer(block, dtype=np.uint8)
        lengths = _fields(raw, starts, 8).view("<u8").reshape(-1)
        length_crcs = _fields(raw, starts + _LENGTH.size, 4).view("<u4").reshape(-1)
        data_crcs = _fields(raw, ends - _CRC.size, 4).view("<u4").reshape(-1)
        # Records of a file have few distinct lengths: one checksum for each.
        distinct, which = np.unique(lengths, return_inverse=True)
        expected = np.array([masked_crc(_LENGTH.pack(int(n))) for n in distinct.tolist()],
                            dtype=np.uint32)
        computed = _masked(np.fromiter(map(google_crc32c.value, data), dtype=np.uint64,
                                       count=len(data)))
        if (np.any(lengths.astype(np.int64) + _OVERHEAD != ends - starts)
                or np.any(expected[which] != length_crcs) or np.any(computed != data_crcs)):
            return self._cut_one_by_one(block, offsets, record)
        return data

    def _cut_one_by_one(self, block, offsets, record):
        """As `_cut`, a record at a time: the `DataError` raised names the first record that
        fails a check."""
        base, records = offsets[0], []
        for i in range(len(offsets) - 1):
            at, next_at = offsets[i] - base, offsets[i + 1] - base
            if at + _HEADER.size > len(block):
                raise self._truncated(record + i, "the file ends inside its header", offsets[i])
            length, length_crc = _HEADER.unpack_from(block, at)
            self._check_length_crc(record + i, block[at:at + _LENGTH.size], length_crc)
            if length + _OVERHEAD != next_at - at:
                raise DataError(
                    f"Record {record + i} of {self._path} does not match the file's index: the "
                    "file changed while it was being read. Received: length="
                    f"{length}, indexed length={next_at - at - _OVERHEAD}"
                )
            if next_at > len(block):
                raise self._truncated(record + i, "the file ends inside its data", offsets[i])
            data = block[at + _HEADER.size:next_at - _CRC.size]
            stored = _CRC.unpack_from(block, next_at - _CRC.size)[0]
            computed = masked_crc(data)
            if stored != computed:
                raise DataError(
                    f"Record {record + i} of {self._path} is corrupt: the data checksum does "
                    f"not match. Received: stored crc=0x{stored:08x}, computed "
                    f"crc=0x{computed:08x}"
                )
            records.append(data)
        return records

    def _check_length_crc(self, record, length_bytes, stored):
        computed = masked_crc(length_bytes)
        if stored != computed:
            raise DataError(
                f"Record {record} of {self._path} is corrupt: the length checksum does not "
                f"match. Received: stored crc=0x{stored:08x}, computed crc=0x{computed:08x}"
            )

    def _truncated(self, record, what, offset):
        return DataError(
            f"Record {record} of {self._path} is truncated: {what}. "
            f"Received: record offset={offset}"
        )


class TFRecordWriter:
    """Writes records to an uncompressed TFRecord file.

    Args:
        target: the file to create (replaced if it exists), or a binary file object open for
            writing, which the writer writes to but does not close.

    Example:

        >>> with TFRecordWriter("/tmp/example.tfrecord") as writer:
        ...     writer.write(b"first record")
        ...     writer.write(b"second record")
    """

    def __init__(self, target):
        self._owns_file = not hasattr(target, "write")
        self._file = open(target, "wb") if self._owns_file else target

    def write(self, record):
        """Appends one record (bytes-like)."""
        data = bytes(record)
        length = _LENGTH.pack(len(data))
        self._file.write(b"".join(
            (length, _CRC.pack(masked_crc(length)), data, _CRC.pack(masked_crc(data)))
        ))

    def flush(self):
        """Pushes buffered records to the operating system."""
        self._file.flush()

    def close(self):
        """Flushes the records, and closes the file if the writer opened it."""
        self._file.flush()
        if self._owns_file:
            self._file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()
