"""TFRecord reading and writing: checksums, truncation, and interchange with TensorFlow."""

import os
import struct

import pytest

from elastic_keras.common.errors import DataError
from elastic_keras.data.tfrecord import TFRecordReader, TFRecordWriter, masked_crc

from record_files import tfrecord_records, write_tfrecord


def _offset_of(records, n):
    return sum(len(r) + 16 for r in records[:n])


def _flip_byte(path, offset, keep_mtime=False):
    stat = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    if keep_mtime:
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_masked_crc_of_known_value():
    # The masked CRC32C of an empty string, as TensorFlow computes it.
    assert masked_crc(b"") == 0xA282EAD8


def test_flipped_payload_byte_names_the_record(tmp_path):
    records = tfrecord_records(10)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    _flip_byte(path, _offset_of(records, 6) + 12 + 3)
    reader = TFRecordReader(path)  # Indexing skips payloads, so opening succeeds.
    assert list(reader.read(0, 6)) == records[:6]
    assert list(reader.read(7, 10)) == records[7:]
    with pytest.raises(DataError, match=r"Record 6 of .*a.tfrecord is corrupt: the data checks"):
        list(reader.read(5, 8))


def test_flipped_length_byte_fails_indexing_naming_the_record(tmp_path):
    records = tfrecord_records(10)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    _flip_byte(path, _offset_of(records, 4) + 1)
    with pytest.raises(DataError, match=r"Record 4 of .*a.tfrecord is corrupt: the length check"):
        TFRecordReader(path)


def test_flipped_length_byte_under_a_valid_index_fails_reading(tmp_path):
    records = tfrecord_records(10)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    TFRecordReader(path)  # Builds the index.
    _flip_byte(path, _offset_of(records, 4) + 1, keep_mtime=True)
    reader = TFRecordReader(path)  # The stored index still matches size and mtime.
    assert list(reader.read(5, 10)) == records[5:]
    with pytest.raises(DataError, match=r"Record 4 of .*a.tfrecord is corrupt: the length check"):
        list(reader.read(2, 6))


def test_flipped_length_checksum_byte_under_a_valid_index_fails_reading(tmp_path):
    # The length still matches the index; only its stored checksum is wrong.
    records = tfrecord_records(10)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    TFRecordReader(path)  # Builds the index.
    _flip_byte(path, _offset_of(records, 7) + 9, keep_mtime=True)
    reader = TFRecordReader(path)
    assert reader.read(0, 7) == records[:7]
    with pytest.raises(DataError, match=r"Record 7 of .*a.tfrecord is corrupt: the length check"):
        reader.read(3, 9)


@pytest.mark.parametrize("record", [0, 1, 2047, 4095])
def test_a_corrupt_record_among_thousands_is_named(tmp_path, record):
    # Many records of a few lengths, over several blocks of the reader: each check covers
    # every record of a block at once, and the failing one is still named.
    records = [bytes([i % 256]) * (300 + i % 5) for i in range(4096)]  # 1.3 MB
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    assert TFRecordReader(path).read(0, 4096) == records
    _flip_byte(path, _offset_of(records, record) + 12 + 50)
    reader = TFRecordReader(path)
    with pytest.raises(DataError, match=rf"Record {record} of .*a.tfrecord is corrupt: the data"):
        reader.read(0, 4096)
    assert reader.read(record + 1, 4096) == records[record + 1:]


def test_flipped_data_checksum_byte_is_detected(tmp_path):
    records = tfrecord_records(3)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    _flip_byte(path, _offset_of(records, 3) - 1)
    with pytest.raises(DataError, match="Record 2 .* data checksum"):
        list(TFRecordReader(path).read(0, 3))


@pytest.mark.parametrize("cut, what", [(3, "data but the file ends 3 bytes short"),
                                       (20, "ends 20 bytes short"),
                                       (40, "ends 5 bytes into the header"),
                                       (None, "into the header")])
def test_truncated_file_names_the_last_record(tmp_path, cut, what):
    records = tfrecord_records(5)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    size = os.path.getsize(path)
    # `None` leaves 5 bytes of a sixth record's header.
    with open(path, "r+b") as f:
        if cut is None:
            f.seek(0, os.SEEK_END)
            f.write(b"\x00" * 5)
        else:
            f.truncate(size - cut)
    record = 5 if cut is None else 4  # Record 4 takes 45 bytes.
    with pytest.raises(DataError, match=rf"Record {record} of .*a.tfrecord is truncated.*{what}"):
        TFRecordReader(path)


def test_empty_file_has_no_records(tmp_path):
    path = write_tfrecord(tmp_path / "empty.tfrecord", [])
    reader = TFRecordReader(path)
    assert reader.num_records == 0
    assert list(reader.read(0, 0)) == []


def test_large_records_are_indexed_and_read(tmp_path):
    records = [os.urandom(200_000), b"small", os.urandom(2_000_000), b""]
    path = write_tfrecord(tmp_path / "big.tfrecord", records)
    reader = TFRecordReader(path)
    assert reader.num_records == 4
    assert list(reader.read(1, 4)) == records[1:]


def test_writer_layout(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"abc"])
    data = open(path, "rb").read()
    length, length_crc = struct.unpack("<QI", data[:12])
    assert (length, length_crc) == (3, masked_crc(data[:8]))
    assert data[12:15] == b"abc"
    assert struct.unpack("<I", data[15:])[0] == masked_crc(b"abc")


def test_writer_accepts_an_open_file_and_leaves_it_open(tmp_path):
    with open(tmp_path / "a.tfrecord", "wb") as f:
        with TFRecordWriter(f) as writer:
            writer.write(b"x")
        assert not f.closed
    assert list(TFRecordReader(str(tmp_path / "a.tfrecord")).read(0, 1)) == [b"x"]


def test_tensorflow_reads_our_files(tmp_path):
    tf = pytest.importorskip("tensorflow")
    records = tfrecord_records(50)
    path = write_tfrecord(tmp_path / "ours.tfrecord", records)
    assert [r.numpy() for r in tf.data.TFRecordDataset(path)] == records


def test_we_read_tensorflow_files(tmp_path):
    tf = pytest.importorskip("tensorflow")
    records = tfrecord_records(50)
    path = str(tmp_path / "theirs.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    reader = TFRecordReader(path)
    assert list(reader.read(0, 50)) == records
    assert list(reader.read(31, 33)) == records[31:33]


def test_reader_does_not_import_tensorflow():
    import subprocess
    import sys

    code = ("import sys, elastic_keras.data.reader, elastic_keras.data.shards; "
            "sys.exit('tensorflow' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_record_is_described_by_its_index(tmp_path):
    path = write_tfrecord(tmp_path / "d.tfrecord", tfrecord_records(3))
    assert TFRecordReader(path).describe_record(2) == f"record 2 of {path}"
