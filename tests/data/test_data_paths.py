"""expand_paths: a file, a directory or a glob, and the errors when nothing matches."""

import os

import pytest

from elastic_keras.common.errors import DataError
from elastic_keras.data.paths import expand_paths


@pytest.fixture
def data_dir(tmp_path):
    names = ["b.tfrecord", "a.tfrecords", "c.rec", "d.tfr", "e.csv", "e.csv.index",
             "a.tfrecords.index", ".hidden.tfrecord", "README.md"]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "deep.tfrecord").write_bytes(b"")
    return tmp_path


def test_directory_lists_record_files_sorted_not_recursively(data_dir):
    assert expand_paths(str(data_dir)) == [
        str(data_dir / name) for name in ["a.tfrecords", "b.tfrecord", "c.rec", "d.tfr", "e.csv"]
    ]


def test_file(data_dir, monkeypatch):
    monkeypatch.chdir(data_dir)
    assert expand_paths("c.rec") == [str(data_dir / "c.rec")]


def test_glob(data_dir):
    assert expand_paths(str(data_dir / "*.tf*")) == [
        str(data_dir / "a.tfrecords"), str(data_dir / "b.tfrecord"), str(data_dir / "d.tfr")
    ]
    assert expand_paths(str(data_dir / "**" / "*.tfrecord")) == [
        str(data_dir / "b.tfrecord"), str(data_dir / "sub" / "deep.tfrecord")
    ]


def test_paths_are_absolute(data_dir, monkeypatch):
    monkeypatch.chdir(data_dir)
    assert all(os.path.isabs(p) for p in expand_paths("*.csv") + expand_paths("."))


def test_nothing_there(tmp_path):
    spec = str(tmp_path / "missing")
    message = rf"--validation-data matches no record file.*Received: '{spec}'"
    with pytest.raises(DataError, match=message):
        expand_paths(spec, flag="--validation-data")


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(DataError, match="--training-data matches no record file.*matches no files"):
        expand_paths(str(tmp_path / "*.tfrecord"))


def test_directory_of_unsupported_files_lists_them(tmp_path):
    (tmp_path / "x.parquet").write_bytes(b"")
    (tmp_path / "y.json").write_bytes(b"")
    (tmp_path / "x.tfrecord.index").write_bytes(b"")
    with pytest.raises(DataError, match=r"accepted extensions: \.tfrecord.*it matches x\.parquet, "
                                        r"y\.json\. Received"):
        expand_paths(str(tmp_path))


def test_unsupported_file(tmp_path):
    (tmp_path / "x.json").write_bytes(b"")
    with pytest.raises(DataError, match="must end with one of .tfrecord, .tfrecords, .rec, .tfr"):
        expand_paths(str(tmp_path / "x.json"))


def test_gzipped_file_suggests_converting_it(tmp_path):
    (tmp_path / "x.csv.gz").write_bytes(b"")
    with pytest.raises(DataError, match="elastic-keras data .*x.csv.gz --output DIR"):
        expand_paths(str(tmp_path / "x.csv.gz"))
