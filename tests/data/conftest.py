"""Fixtures for the data package's tests: record files of known content, a private cache."""

import pytest

from elastic_keras.data import index

from record_files import csv_records, tfrecord_records, write_csv, write_tfrecord


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    """Keeps every test's fallback indexes out of the user's home directory."""
    path = tmp_path / "index-cache"
    monkeypatch.setattr(index, "DEFAULT_CACHE_DIR", str(path))
    return path


@pytest.fixture(params=["tfrecord", "csv"])
def record_file(request, tmp_path):
    """`(path, records)`: a file of each format holding known records."""
    if request.param == "tfrecord":
        records = tfrecord_records(23)
        return write_tfrecord(tmp_path / "data.tfrecord", records), records
    records = csv_records(23)
    return write_csv(tmp_path / "data.csv", records), records
