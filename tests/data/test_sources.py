"""Loading CSV, .npz and named data sets into typed columns."""

import gzip

import numpy as np
import pytest

from elastic_keras.common.errors import DataError
from elastic_keras.data.sources import NAMED_DATASETS, csv_to_columns, load_source, npz_to_columns


def test_csv_columns_are_typed(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("i,f,s,gap\n1,1.5,x,2\n-2,3,y,\n\n3,1e3,\"z, w\",0.5\n")
    columns = csv_to_columns(str(path))
    assert list(columns) == ["i", "f", "s", "gap"]
    assert columns["i"].dtype == np.int64 and columns["i"].tolist() == [1, -2, 3]
    assert columns["f"].dtype == np.float64 and columns["f"].tolist() == [1.5, 3.0, 1000.0]
    assert columns["s"].dtype.kind == "U" and columns["s"].tolist() == ["x", "y", "z, w"]
    assert np.isnan(columns["gap"][1]) and columns["gap"][2] == 0.5


def test_gzipped_csv_without_header(tmp_path):
    path = tmp_path / "a.csv.gz"
    with gzip.open(path, "wt") as f:
        f.write("1,2,3\n4,5,6\n")
    columns = csv_to_columns(str(path), header=False)
    assert {k: v.tolist() for k, v in columns.items()} == {
        "column_0": [1, 4], "column_1": [2, 5], "column_2": [3, 6]
    }


def test_column_names_gather_columns(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("p0,p1,p2,label\n1,2,3,7\n4,5,6,8\n")
    columns = csv_to_columns(str(path), column_names=["image:3", "label"])
    assert columns["image"].tolist() == [[1, 2, 3], [4, 5, 6]]
    assert columns["label"].tolist() == [7, 8]


@pytest.mark.parametrize("names, message", [
    (["a", "b"], "must cover the 3 columns.*they cover 2"),
    (["a:x", "b"], "'name:k' with k a positive integer"),
    (["a", "a", "b"], "must be unique"),
])
def test_bad_column_names(tmp_path, names, message):
    path = tmp_path / "a.csv"
    path.write_text("1,2,3\n")
    with pytest.raises(DataError, match=message):
        csv_to_columns(str(path), header=False, column_names=names)


def test_ragged_row_names_the_row(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a,b\n1,2\n3\n")
    with pytest.raises(DataError, match="must have 2 fields; data row 1 .*has 1. Received: '3'"):
        csv_to_columns(str(path))


def test_header_only_csv_is_an_error(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("a,b\n")
    with pytest.raises(DataError, match="no data rows"):
        csv_to_columns(str(path))


def test_npz_arrays_are_columns(tmp_path):
    path = tmp_path / "a.npz"
    np.savez(path, x=np.ones((4, 2)), y=np.arange(4))
    columns = npz_to_columns(str(path))
    assert columns["x"].shape == (4, 2) and columns["y"].tolist() == [0, 1, 2, 3]


def test_load_source_errors(tmp_path):
    with pytest.raises(DataError, match="Unknown data set name.*sklearn:digits.*Received: 'sk:x'"):
        load_source("sk:x")
    with pytest.raises(DataError, match="does not exist. Received: '.*missing.csv'"):
        load_source(str(tmp_path / "missing.csv"))
    (tmp_path / "a.json").write_text("{}")
    with pytest.raises(DataError, match=r"\.csv, \.csv\.gz or \.npz file"):
        load_source(str(tmp_path / "a.json"))


def test_sklearn_digits():
    pytest.importorskip("sklearn")
    columns = load_source("sklearn:digits")
    assert columns["image"].shape == (1797, 64) and columns["image"].dtype == np.int64
    assert columns["image"].min() == 0 and columns["image"].max() == 16
    assert sorted(set(columns["label"].tolist())) == list(range(10))


@pytest.mark.parametrize("name, rows, width", [
    ("sklearn:iris", 150, 4), ("sklearn:wine", 178, 13), ("sklearn:breast_cancer", 569, 30)
])
def test_sklearn_feature_sets(name, rows, width):
    pytest.importorskip("sklearn")
    columns = load_source(name)
    assert columns["features"].shape == (rows, width)
    assert columns["features"].dtype == np.float64 and columns["label"].dtype == np.int64


def test_named_datasets_are_listed():
    assert {"sklearn:digits", "sklearn:iris", "sklearn:breast_cancer", "sklearn:wine",
            "keras:mnist", "keras:fashion_mnist"} <= set(NAMED_DATASETS)
