"""list_shards and split_range."""

import logging

import pytest

from elastic_keras.common.errors import ConfigError, DataError
from elastic_keras.data.shards import Shard, list_shards, split_range

from record_files import csv_records, write_csv, write_tfrecord


def test_list_shards_counts_records_and_skips_empty_files(tmp_path, caplog):
    write_tfrecord(tmp_path / "b.tfrecord", [b"x"] * 3)
    write_tfrecord(tmp_path / "a.tfrecord", [b"y"] * 5)
    write_tfrecord(tmp_path / "c.tfrecord", [])
    with caplog.at_level(logging.WARNING):
        shards = list_shards(str(tmp_path))
    assert shards == [
        Shard(str(tmp_path / "a.tfrecord"), 5), Shard(str(tmp_path / "b.tfrecord"), 3)
    ]
    assert "c.tfrecord" in caplog.text and "holds no records" in caplog.text


def test_list_shards_of_csv_files(tmp_path):
    write_csv(tmp_path / "a.csv", csv_records(4))
    assert list_shards(str(tmp_path / "*.csv")) == [Shard(str(tmp_path / "a.csv"), 4)]


def test_only_empty_files_is_an_error(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", [])
    with pytest.raises(DataError, match="--validation-data names only empty record files"):
        list_shards(str(tmp_path), flag="--validation-data")


def test_mixed_formats_are_rejected(tmp_path):
    write_tfrecord(tmp_path / "a.tfrecord", [b"x"])
    write_csv(tmp_path / "b.csv", csv_records(2))
    with pytest.raises(DataError, match="one record format.*Received: tfrecord .*, csv"):
        list_shards(str(tmp_path))


def test_list_shards_passes_the_index_cache_dir(tmp_path, monkeypatch):
    from elastic_keras.data import shards

    seen = []
    monkeypatch.setattr(shards, "open_reader",
                        lambda path, index_cache_dir: seen.append(index_cache_dir) or _Fake())
    write_tfrecord(tmp_path / "a.tfrecord", [b"x"])
    list_shards(str(tmp_path), index_cache_dir="/cache")
    assert seen == ["/cache"]


class _Fake:
    num_records = 1

    class metadata:  # noqa: N801 (stands in for a Metadata instance)
        format = "tfrecord"


@pytest.mark.parametrize("num_records, per_task, expected", [
    (10, 4, [(0, 4), (4, 8), (8, 10)]),
    (8, 4, [(0, 4), (4, 8)]),
    (3, 10, [(0, 3)]),
    (0, 5, []),
    (1, 1, [(0, 1)]),
])
def test_split_range(num_records, per_task, expected):
    assert split_range(num_records, per_task) == expected


def test_split_range_covers_every_record_once():
    ranges = split_range(1003, 17)
    assert [r for start, end in ranges for r in range(start, end)] == list(range(1003))


@pytest.mark.parametrize("num_records, per_task", [(10, 0), (10, -1), (-1, 5)])
def test_split_range_rejects_bad_values(num_records, per_task):
    with pytest.raises(ConfigError, match="Received"):
        split_range(num_records, per_task)
