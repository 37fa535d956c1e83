"""Behaviour every RecordReader implementation shares, run against each format."""

import numpy as np
import pytest

from elastic_keras.common.errors import DataError
from elastic_keras.data.reader import Metadata, RecordReader, open_reader, reader_class


def test_counts_and_reads_every_record(record_file):
    path, records = record_file
    reader = open_reader(path)
    assert isinstance(reader, RecordReader)
    assert reader.num_records == len(records)
    assert list(reader.read(0, len(records))) == records


def test_every_range_equals_the_slice_of_a_sequential_read(record_file):
    path, records = record_file
    reader = open_reader(path)
    for start in range(len(records) + 1):
        for end in range(start, len(records) + 1, 3):
            assert list(reader.read(start, end)) == records[start:end], (start, end)


def test_accepts_numpy_integers(record_file):
    path, records = record_file
    reader = open_reader(path)
    assert list(reader.read(np.int64(5), np.int64(9))) == records[5:9]


def test_metadata(record_file):
    path, records = record_file
    metadata = open_reader(path).metadata
    assert isinstance(metadata, Metadata)
    assert metadata.path == path
    assert metadata.num_records == len(records)
    assert metadata.format == reader_class(path).FORMAT


@pytest.mark.parametrize("start, end", [(-1, 2), (3, 2), (0, 24), (24, 24)])
def test_range_outside_the_file_is_rejected_at_once(record_file, start, end):
    path, _ = record_file
    reader = open_reader(path)
    with pytest.raises(DataError, match=rf"\[{start}, {end}\).*{path}.*Received: start={start}"):
        reader.read(start, end)


def test_index_is_built_once_and_reused(record_file, monkeypatch):
    path, records = record_file
    cls = reader_class(path)
    calls = []
    original = cls._scan
    monkeypatch.setattr(cls, "_scan", lambda self, *a: calls.append(1) or original(self, *a))
    open_reader(path)
    open_reader(path)
    assert len(calls) == 1
    assert list(open_reader(path).read(20, 23)) == records[20:23]


def test_empty_range_yields_nothing(record_file):
    path, _ = record_file
    assert list(open_reader(path).read(4, 4)) == []


def test_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="Cannot read the record file .*missing.tfrecord"):
        open_reader(tmp_path / "missing.tfrecord")
