"""Converting columns of data into sharded training record files (TFRecord or CSV).

`write_examples` writes one `tf.train.Example` per row: each column's row, flattened, becomes
one feature (integers and booleans an `int64_list`, floats a `float_list`, strings and bytes a
`bytes_list`). `write_csv` writes the same rows as CSV with a header. `convert` runs a whole
`elastic-keras data` conversion: load, hold out a test split, shuffle, write.

Example:

    >>> import numpy as np
    >>> files = write_examples(
    ...     {"x": np.zeros((10, 3), np.float32), "y": np.arange(10)}, "/tmp/out", num_shards=2
    ... )
    >>> [os.path.basename(f) for f in files]
    ['data-00000-of-00002.tfrecord', 'data-00001-of-00002.tfrecord']
"""

import csv
import dataclasses
import glob
import os

import numpy as np

from elastic_keras.common.errors import ConfigError, DataError
from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.data.index import INDEX_SUFFIX
from elastic_keras.data.sources import csv_to_columns, load_source
from elastic_keras.data.tfrecord import TFRecordWriter

__all__ = [
    "ConversionSpec", "ConvertedSplit", "convert", "csv_to_columns", "split_rows",
    "write_csv", "write_examples", "WRITERS",
]

TRAIN_DIR, TEST_DIR = "train", "test"


@dataclasses.dataclass(frozen=True)
class ConversionSpec:
    """One `elastic-keras data` conversion.

    Attributes:
        source: a `.csv`, `.csv.gz` or `.npz` file, or a named data set (`sklearn:digits`).
        output: the output directory.
        num_shards: record files per output directory.
        holdout_every: 0 for no split; K (2 or more) sends rows whose index % K == 0 to
            `output/test/` and the others to `output/train/`.
        shuffle: shuffle rows (within each split, so the split stays by original index).
        seed: the shuffle's seed.
        header: for CSV sources, whether the first line holds column names.
        column_names: for CSV sources, column names (`name` or `name:k`, see
            `csv_to_columns`).
        format: `"tfrecord"` or `"csv"`.
        prefix: shard file names start with it.

    Raises:
        ConfigError: a value breaks its rule.
    """

    source: str
    output: str
    num_shards: int = 1
    holdout_every: int = 0
    shuffle: bool = False
    seed: int = 0
    header: bool = True
    column_names: tuple[str, ...] = ()
    format: str = "tfrecord"
    prefix: str = "data"

    def __post_init__(self):
        if self.num_shards < 1:
            raise ConfigError(
                f"--num-shards must be a positive integer. Received: {self.num_shards!r}"
            )
        if self.holdout_every == 1 or self.holdout_every < 0:
            raise ConfigError(
                "--holdout-every must be 2 or more (every K-th row goes to the test split), "
                f"or 0 for no split. Received: {self.holdout_every!r}"
            )
        if self.format not in WRITERS:
            raise ConfigError(
                f"--format must be one of {', '.join(WRITERS)}. Received: {self.format!r}"
            )


@dataclasses.dataclass(frozen=True)
class ConvertedSplit:
    """What one output directory received."""

    directory: str
    files: tuple[str, ...]
    rows: int


def convert(spec):
    """Runs `spec`: loads its source, splits and shuffles rows, writes the shards.

    Returns:
        A `ConvertedSplit` per output directory (`train`, `test`, or the output itself).

    Raises:
        DataError: the source is missing, malformed or unknown.
        ConfigError: a split has fewer rows than `num_shards`.
        OSError: the output cannot be written.
    """
    columns = load_source(spec.source, header=spec.header, column_names=spec.column_names)
    num_rows = _num_rows(columns)
    results = []
    for name, rows in split_rows(num_rows, spec.holdout_every, spec.shuffle, spec.seed).items():
        directory = os.path.join(spec.output, name) if name else spec.output
        part = {column: values[rows] for column, values in columns.items()}
        files = WRITERS[spec.format](part, directory, spec.num_shards, spec.prefix)
        results.append(ConvertedSplit(directory, tuple(files), len(rows)))
    return results


def split_rows(num_rows, holdout_every=0, shuffle=False, seed=0):
    """Row indices per output split.

    Args:
        num_rows: how many rows there are.
        holdout_every: 0 for one split named `""`; K sends rows with index % K == 0 to
            `"test"` and the rest to `"train"`.
        shuffle: permute each split's rows (after splitting).
        seed: the permutation's seed.

    Returns:
        `{split name: int64 array of row indices}`.
    """
    rows = np.arange(num_rows)
    if holdout_every:
        held_out = rows % holdout_every == 0
        splits = {TRAIN_DIR: rows[~held_out], TEST_DIR: rows[held_out]}
    else:
        splits = {"": rows}
    if shuffle:
        rng = np.random.default_rng(seed)
        splits = {name: rng.permutation(part) for name, part in splits.items()}
    return splits


def write_examples(columns, output_dir, num_shards=1, prefix="data"):
    """Writes the rows of `columns` as `tf.train.Example` records into TFRecord shards.

    Args:
        columns: `{feature name: array}`; every array's first axis is the row.
        output_dir: the directory to write (created if needed).
        num_shards: how many files; rows are cut into that many consecutive runs.
        prefix: file names are `{prefix}-{i:05d}-of-{n:05d}.tfrecord`.

    Returns:
        The written files, in shard order. Each is written atomically; older shards with the
        same prefix and another shard count are removed.

    Raises:
        DataError: the columns are empty, of different lengths, or of an unsupported dtype.
        ConfigError: there are fewer rows than shards.
    """
    encode = _example_encoder(columns)

    def write(f, start, end):
        with TFRecordWriter(f) as writer:
            for row in range(start, end):
                writer.write(encode(row))

    return _write_shards(columns, output_dir, num_shards, prefix, "tfrecord", "wb", write)


def write_csv(columns, output_dir, num_shards=1, prefix="data"):
    """Writes the rows of `columns` as CSV shards with a header line.

    A column with more than one value per row becomes columns `name_0 .. name_{k-1}`;
    booleans are written as 0 and 1. Arguments, result and errors are as for
    `write_examples`, with files named `{prefix}-{i:05d}-of-{n:05d}.csv`.
    """
    _num_rows(columns)
    header, cells = [], []
    for name, values in columns.items():
        flat = _flat(name, values)
        if flat.dtype.kind == "b":
            flat = flat.astype(np.int64)
        elif flat.dtype.kind in "SO":
            flat = np.char.decode(_as_bytes(name, flat).astype(bytes), "utf-8")
        header += [name] if flat.shape[1] == 1 and np.ndim(values) == 1 else [
            f"{name}_{i}" for i in range(flat.shape[1])
        ]
        cells.append(flat.astype(str))
    table = np.concatenate(cells, axis=1)

    def write(f, start, end):
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(header)
        writer.writerows(table[start:end].tolist())

    return _write_shards(columns, output_dir, num_shards, prefix, "csv", "w", write)


WRITERS = {"tfrecord": write_examples, "csv": write_csv}


def _write_shards(columns, output_dir, num_shards, prefix, extension, mode, write):
    num_rows = _num_rows(columns)
    if num_shards < 1 or num_shards > num_rows:
        raise ConfigError(
            f"The number of shards must be between 1 and the number of rows ({num_rows}) "
            f"written to {output_dir}. Received: num_shards={num_shards!r}"
        )
    os.makedirs(output_dir, exist_ok=True)
    paths = []
    bounds = np.linspace(0, num_rows, num_shards + 1).round().astype(int).tolist()
    for shard, (start, end) in enumerate(zip(bounds[:-1], bounds[1:])):
        path = os.path.join(output_dir, f"{prefix}-{shard:05d}-of-{num_shards:05d}.{extension}")
        with atomic_write(path, mode) as f:
            write(f, start, end)
        paths.append(path)
    _remove_stale_shards(output_dir, prefix, paths)
    return paths


def _remove_stale_shards(output_dir, prefix, keep):
    """Removes shards (and their indexes) of an earlier conversion with the same prefix."""
    pattern = os.path.join(glob.escape(output_dir), f"{glob.escape(prefix)}-?????-of-?????.*")
    for path in glob.glob(pattern):
        if path in keep or (path.endswith(INDEX_SUFFIX) and path[:-len(INDEX_SUFFIX)] in keep):
            continue
        if path.endswith((".tfrecord", ".csv", INDEX_SUFFIX)):
            os.unlink(path)


def _num_rows(columns):
    if not columns:
        raise DataError("There must be at least one column to write. Received: no columns")
    lengths = {}
    for name, values in columns.items():
        if not isinstance(name, str) or not name:
            raise DataError(f"Column names must be non-empty strings. Received: {name!r}")
        shape = np.shape(values)
        if not shape:
            raise DataError(
                f"Column {name!r} must have a first axis (one entry per row). "
                f"Received: a scalar {values!r}"
            )
        lengths[name] = shape[0]
    if len(set(lengths.values())) > 1:
        raise DataError(f"Every column must have the same number of rows. Received: {lengths}")
    num_rows = next(iter(lengths.values()))
    if num_rows == 0:
        raise DataError("There are no rows to write. Received: 0 rows")
    return num_rows


def _flat(name, values):
    values = np.asarray(values)
    if values.dtype.kind not in "biufSUO":
        raise DataError(
            f"Column {name!r} must hold integers, booleans, floats, strings or bytes. "
            f"Received: dtype {values.dtype}"
        )
    return values.reshape(len(values), -1)


def _example_encoder(columns):
    """Returns `encode(row) -> bytes`, the serialized `tf.train.Example` of one row."""
    import tensorflow as tf

    _num_rows(columns)
    # One Example is reused: refilling its lists is much faster than building one per row.
    example = tf.train.Example()
    fields = []
    for name, values in columns.items():
        flat = _flat(name, values)
        feature = example.features.feature[name]
        if flat.dtype.kind in "biu":
            fields.append((feature.int64_list.value, flat.astype(np.int64)))
        elif flat.dtype.kind == "f":
            fields.append((feature.float_list.value, flat.astype(np.float32)))
        else:
            fields.append((feature.bytes_list.value, _as_bytes(name, flat)))

    def encode(row):
        for field, values in fields:
            field[:] = values[row].tolist()
        return example.SerializeToString()

    return encode


def _as_bytes(name, flat):
    """A string, bytes or object array as an array of bytes (UTF-8 for strings)."""
    if flat.dtype.kind == "U":
        return np.char.encode(flat, "utf-8")
    if flat.dtype.kind == "S":
        return flat
    encoded = np.empty(flat.shape, dtype=object)
    for index, value in np.ndenumerate(flat):
        if isinstance(value, str):
            value = value.encode("utf-8")
        if not isinstance(value, bytes):
            raise DataError(
                f"Column {name!r} mixes strings with other values; every value must be a str "
                f"or bytes. Received: {value!r} at row {index[0]}"
            )
        encoded[index] = value
    return encoded
