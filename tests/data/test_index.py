"""The sidecar offset index: where it lives, when it is reused, rebuilt or distrusted."""

import os
import threading

import numpy as np
import pytest

from elastic_keras.data import index
from elastic_keras.data.index import index_locations, load_or_build_index
from elastic_keras.data.reader import open_reader
from elastic_keras.data.tfrecord import TFRecordReader

from record_files import tfrecord_records, write_tfrecord


@pytest.fixture
def counted_scans(monkeypatch):
    """Counts how often a TFRecord file is scanned to build its index."""
    calls = []
    original = TFRecordReader._scan
    monkeypatch.setattr(
        TFRecordReader, "_scan", lambda self, *a: calls.append(self.path) or original(self, *a)
    )
    return calls


def test_index_is_stored_beside_the_file_and_reused(tmp_path, counted_scans):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(20))
    open_reader(path)
    beside = path + ".index"
    assert os.path.exists(beside)
    built = os.stat(beside).st_mtime_ns
    for _ in range(3):
        assert open_reader(path).num_records == 20
    assert len(counted_scans) == 1
    assert os.stat(beside).st_mtime_ns == built


def test_index_is_rebuilt_after_the_file_changes(tmp_path, counted_scans):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(20))
    assert open_reader(path).num_records == 20
    records = tfrecord_records(30)
    write_tfrecord(path, records)
    reader = open_reader(path)
    assert reader.num_records == 30
    assert list(reader.read(25, 30)) == records[25:]
    assert len(counted_scans) == 2


def test_index_is_rebuilt_when_only_the_mtime_changes(tmp_path, counted_scans):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(5))
    open_reader(path)
    stat = os.stat(path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    open_reader(path)
    assert len(counted_scans) == 2


def test_read_only_directory_uses_the_cache_folder(tmp_path, monkeypatch, counted_scans):
    data_dir = tmp_path / "readonly"
    data_dir.mkdir()
    path = write_tfrecord(data_dir / "a.tfrecord", tfrecord_records(10))
    cache = tmp_path / "cache"
    data_dir.chmod(0o555)
    # Tests may run as root, who can write anyway; make the check see what a user would.
    real_access = os.access
    monkeypatch.setattr(
        index.os, "access", lambda p, mode: str(p) != str(data_dir) and real_access(p, mode)
    )
    try:
        assert open_reader(path, index_cache_dir=str(cache)).num_records == 10
        assert open_reader(path, index_cache_dir=str(cache)).num_records == 10
    finally:
        data_dir.chmod(0o755)
    assert not os.path.exists(path + ".index")
    assert [p.name for p in cache.iterdir()] == [os.path.basename(index_locations(path, cache)[1])]
    assert len(counted_scans) == 1


def test_failed_write_beside_the_file_falls_back_to_the_cache(tmp_path, monkeypatch, cache_dir):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(10))
    real_write = index.atomic_write

    def refuse_beside(location, *args):
        if location == path + ".index":
            raise PermissionError(13, "Permission denied", location)
        return real_write(location, *args)

    monkeypatch.setattr(index, "atomic_write", refuse_beside)
    assert open_reader(path).num_records == 10
    cached = index_locations(path)[1]
    assert os.path.dirname(cached) == str(cache_dir)
    assert os.path.exists(cached)
    assert not os.path.exists(path + ".index")


def test_no_writable_location_still_returns_the_offsets(tmp_path, monkeypatch, caplog):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(10))

    def refuse(location, *args):
        raise PermissionError(13, "Permission denied", location)

    monkeypatch.setattr(index, "atomic_write", refuse)
    assert list(open_reader(path).read(9, 10)) == tfrecord_records(10)[9:]
    assert "Could not store the index" in caplog.text


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "empty"])
def test_corrupt_index_is_rebuilt_not_trusted(tmp_path, counted_scans, damage):
    records = tfrecord_records(20)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    open_reader(path)
    beside = path + ".index"
    data = bytearray(open(beside, "rb").read())
    if damage == "truncate":
        data = data[:-5]
    elif damage == "flip":
        data[-3] ^= 0x40
    elif damage == "garbage":
        data = bytearray(b"not an index at all" * 5)
    else:
        data = bytearray()
    open(beside, "wb").write(bytes(data))
    reader = open_reader(path)
    assert list(reader.read(0, 20)) == records
    assert len(counted_scans) == 2
    assert open(beside, "rb").read() != bytes(data)  # Rewritten.


def test_index_of_another_format_is_not_trusted(tmp_path):
    path = str(tmp_path / "x.bin")
    open(path, "wb").write(b"0123456789")
    load_or_build_index(path, "csv", lambda f, size: np.array([0, 10]))
    offsets = load_or_build_index(path, "tfrecord", lambda f, size: np.array([0, 4, 10]))
    assert offsets.tolist() == [0, 4, 10]


def test_offsets_are_read_only(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", tfrecord_records(3))
    for _ in range(2):  # Built, then loaded.
        offsets = load_or_build_index(path, "tfrecord", TFRecordReader(path)._scan)
        with pytest.raises(ValueError):
            offsets[0] = 1


def test_concurrent_builders_agree_and_leave_no_temporary_files(tmp_path):
    records = tfrecord_records(500)
    path = write_tfrecord(tmp_path / "a.tfrecord", records)
    results, errors = [], []

    def build():
        try:
            results.append(list(open_reader(path).read(490, 500)))
        except Exception as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=build) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == [records[490:]] * 8
    assert sorted(os.listdir(tmp_path)) == ["a.tfrecord", "a.tfrecord.index"]


def test_cache_file_name_is_a_hash_of_the_real_path(tmp_path):
    path = write_tfrecord(tmp_path / "a.tfrecord", [b"x"])
    link = tmp_path / "link.tfrecord"
    link.symlink_to(path)
    assert index_locations(path)[1] == index_locations(str(link))[1]
    assert index_locations(path, "/somewhere")[1].startswith("/somewhere/")
