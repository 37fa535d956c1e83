"""Conversion to TFRecord (tf.train.Example) and CSV shards, with holdout split and shuffle."""

import os

import numpy as np
import pytest

from elastic_keras.common.errors import ConfigError, DataError
from elastic_keras.data.convert import (
    ConversionSpec, convert, split_rows, write_csv, write_examples,
)
from elastic_keras.data.reader import open_reader
from elastic_keras.data.shards import list_shards


tf = pytest.importorskip("tensorflow")


def _parse_all(directory, spec):
    readers = [open_reader(shard.path) for shard in list_shards(directory)]
    records = [r for reader in readers for r in reader.read(0, reader.num_records)]
    return [{k: v.numpy() for k, v in tf.io.parse_single_example(r, spec).items()} for r in records]


def test_csv_to_tfrecord_round_trip(tmp_path):
    source = tmp_path / "a.csv"
    source.write_text("age,score,city\n31,0.5,Paris\n42,1.25,Oslo\n7,-2,Lima\n")
    convert(ConversionSpec(source=str(source), output=str(tmp_path / "out")))
    rows = _parse_all(str(tmp_path / "out"), {
        "age": tf.io.FixedLenFeature([], tf.int64),
        "score": tf.io.FixedLenFeature([], tf.float32),
        "city": tf.io.FixedLenFeature([], tf.string),
    })
    assert [(r["age"], r["score"], r["city"]) for r in rows] == [
        (31, 0.5, b"Paris"), (42, 1.25, b"Oslo"), (7, -2.0, b"Lima")
    ]


def test_npz_round_trip_flattens_rows(tmp_path):
    source = tmp_path / "a.npz"
    x = np.arange(5 * 2 * 3, dtype=np.float32).reshape(5, 2, 3)
    np.savez(source, x=x, y=np.arange(5) % 2 == 0, name=np.array([f"n{i}" for i in range(5)]))
    splits = convert(ConversionSpec(source=str(source), output=str(tmp_path / "out"), num_shards=2))
    assert [(len(s.files), s.rows) for s in splits] == [(2, 5)]
    rows = _parse_all(str(tmp_path / "out"), {
        "x": tf.io.FixedLenFeature([6], tf.float32),
        "y": tf.io.FixedLenFeature([], tf.int64),
        "name": tf.io.FixedLenFeature([], tf.string),
    })
    assert np.array_equal(np.stack([r["x"] for r in rows]), x.reshape(5, 6))
    assert [r["y"] for r in rows] == [1, 0, 1, 0, 1]
    assert [r["name"] for r in rows] == [b"n0", b"n1", b"n2", b"n3", b"n4"]


def test_digits_with_holdout(tmp_path):
    pytest.importorskip("sklearn")
    out = tmp_path / "digits"
    splits = convert(ConversionSpec(source="sklearn:digits", output=str(out), num_shards=2,
                                    holdout_every=5))
    assert [(s.directory, s.rows) for s in splits] == [(str(out / "train"), 1437),
                                                        (str(out / "test"), 360)]
    train, test = list_shards(str(out / "train")), list_shards(str(out / "test"))
    assert len(train) == 2 and sum(s.num_records for s in train + test) == 1797
    rows = _parse_all(str(out / "test"), {"image": tf.io.FixedLenFeature([64], tf.int64),
                                          "label": tf.io.FixedLenFeature([], tf.int64)})
    assert rows[0]["image"].max() <= 16 and len(rows) == 360


def test_split_rows_holdout_and_shuffle():
    plain = split_rows(10, holdout_every=3)
    assert plain["test"].tolist() == [0, 3, 6, 9]
    assert plain["train"].tolist() == [1, 2, 4, 5, 7, 8]
    shuffled = split_rows(10, holdout_every=3, shuffle=True, seed=1)
    assert sorted(shuffled["test"].tolist()) == [0, 3, 6, 9]
    assert shuffled["train"].tolist() != plain["train"].tolist()
    assert split_rows(10, shuffle=True, seed=1)[""].tolist() == \
        split_rows(10, shuffle=True, seed=1)[""].tolist()
    assert list(split_rows(4)) == [""]


def test_csv_output_with_array_columns(tmp_path):
    columns = {"image": np.arange(6).reshape(3, 2), "flag": np.array([True, False, True]),
               "w": np.array([0.5, 1.0, 2.0], np.float32), "s": np.array(["a,b", "c", "d"])}
    files = write_csv(columns, str(tmp_path), num_shards=1)
    assert [os.path.basename(f) for f in files] == ["data-00000-of-00001.csv"]
    reader = open_reader(files[0])
    assert reader.metadata.column_names == ("image_0", "image_1", "flag", "w", "s")
    assert list(reader.read(0, 3)) == [b'0,1,1,0.5,"a,b"', b"2,3,0,1.0,c", b"4,5,1,2.0,d"]


def test_shard_names_and_stale_shards_are_replaced(tmp_path):
    columns = {"y": np.arange(10)}
    first = write_examples(columns, str(tmp_path), num_shards=3, prefix="part")
    open_reader(first[0])  # Leaves an index beside it.
    second = write_examples(columns, str(tmp_path), num_shards=2, prefix="part")
    assert [os.path.basename(f) for f in second] == ["part-00000-of-00002.tfrecord",
                                                     "part-00001-of-00002.tfrecord"]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(f) for f in second)
    assert [s.num_records for s in list_shards(str(tmp_path))] == [5, 5]


@pytest.mark.parametrize("columns, message", [
    ({}, "at least one column"),
    ({"a": np.arange(3), "b": np.arange(4)}, "same number of rows"),
    ({"a": np.array(5)}, "must have a first axis"),
    ({"a": np.zeros(0)}, "no rows"),
    ({"a": np.array([1j, 2j])}, "integers, booleans, floats, strings or bytes"),
    ({"a": np.array(["x", 3], dtype=object)}, "every value must be a str or bytes"),
])
def test_bad_columns(tmp_path, columns, message):
    with pytest.raises(DataError, match=message):
        write_examples(columns, str(tmp_path))


def test_more_shards_than_rows(tmp_path):
    with pytest.raises(ConfigError, match="between 1 and the number of rows \\(2\\).*num_shards=3"):
        write_examples({"a": np.arange(2)}, str(tmp_path), num_shards=3)


@pytest.mark.parametrize("field, value", [("num_shards", 0), ("holdout_every", 1),
                                          ("holdout_every", -2), ("format", "parquet")])
def test_conversion_spec_checks_its_values(field, value):
    with pytest.raises(ConfigError, match=f"--{field.replace('_', '-')} .*Received: {value!r}"):
        ConversionSpec(source="x.csv", output="out", **{field: value})


def test_failed_write_leaves_no_partial_shard(tmp_path, monkeypatch):
    from elastic_keras.data import convert as convert_module

    def broken_encoder(columns):
        def encode(row):
            if row == 2:
                raise RuntimeError("disk full")
            return b"x"
        return encode

    monkeypatch.setattr(convert_module, "_example_encoder", broken_encoder)
    with pytest.raises(RuntimeError):
        write_examples({"a": np.arange(4)}, str(tmp_path))
    assert os.listdir(tmp_path) == []


def _shared_file(shared_data, name):
    path = shared_data / name
    if not path.exists():
        pytest.skip(f"real data file {path} is absent")
    return str(path)


def test_adult_census(shared_data, tmp_path):
    source = _shared_file(shared_data, "adult.csv.gz")
    splits = convert(ConversionSpec(source=source, output=str(tmp_path), num_shards=2))
    assert sum(s.rows for s in splits) == 48_842
    assert sum(s.num_records for s in list_shards(str(tmp_path))) == 48_842
    record = open_reader(splits[0].files[0]).read(0, 1)[0]
    example = tf.io.parse_single_example(record, {
        "age": tf.io.FixedLenFeature([], tf.int64),
        "income": tf.io.FixedLenFeature([], tf.string),
    })
    assert example["age"].numpy() == 25 and example["income"].numpy() == b"<=50K"


def test_mnist_subset_with_gathered_image_column(shared_data, tmp_path):
    source = _shared_file(shared_data, "mnist_5k.csv.gz")
    splits = convert(ConversionSpec(source=source, output=str(tmp_path), header=False,
                                    holdout_every=5, column_names=("image:784", "label"),
                                    shuffle=True))
    assert [s.rows for s in splits] == [4000, 1000]
    rows = _parse_all(str(tmp_path / "test"), {"image": tf.io.FixedLenFeature([784], tf.int64),
                                               "label": tf.io.FixedLenFeature([], tf.int64)})
    assert np.bincount([r["label"] for r in rows]).tolist() == [100] * 10
