"""Loading data to convert into columns: CSV (optionally gzipped), `.npz` and named data sets.

A loaded data set is a dict of column name to numpy array whose first axis is the row.

Example:

    >>> columns = load_source("sklearn:iris")  # doctest: +SKIP
    >>> columns["features"].shape, columns["label"].shape  # doctest: +SKIP
    ((150, 4), (150,))
"""

import csv
import gzip
import os

import numpy as np

from elastic_keras.common.errors import DataError


def load_source(source, header=True, column_names=()):
    """Loads `source` into columns.

    Args:
        source: a `.csv`, `.csv.gz` or `.npz` file, or a name from `NAMED_DATASETS`
            (e.g. `"sklearn:digits"`).
        header: for CSV, whether the first line holds column names.
        column_names: for CSV, names to use instead (see `csv_to_columns`).

    Raises:
        DataError: the file is missing or malformed, or the name is unknown.
    """
    if source in NAMED_DATASETS:
        return NAMED_DATASETS[source]()
    if ":" in source and not os.path.exists(source):
        raise DataError(
            f"Unknown data set name; known names are {', '.join(NAMED_DATASETS)}. "
            f"Received: {source!r}"
        )
    if not os.path.exists(source):
        raise DataError(f"The data source does not exist. Received: {source!r}")
    lowered = source.lower()
    if lowered.endswith((".csv", ".csv.gz")):
        return csv_to_columns(source, header=header, column_names=column_names or None)
    if lowered.endswith(".npz"):
        return npz_to_columns(source)
    raise DataError(
        "A data source must be a .csv, .csv.gz or .npz file or one of "
        f"{', '.join(NAMED_DATASETS)}. Received: {source!r}"
    )


def csv_to_columns(path, header=True, column_names=None):
    """Reads a CSV file (gzipped if its name ends with `.gz`) into typed columns.

    Each column becomes int64 if every value is an integer, float64 if every value is a
    number or empty (empty becomes NaN), and str otherwise. Empty lines are skipped.

    Args:
        path: the `.csv` or `.csv.gz` file.
        header: whether the first line holds column names (skipped when `column_names` is
            given).
        column_names: names for the columns, in order. `"name:k"` gathers the next `k`
            columns into one column of shape `(rows, k)`, e.g. `["image:784", "label"]`.
            Without names or a header, columns are named `column_0`, `column_1`, ...

    Raises:
        DataError: the file is missing or empty, a row has a different number of fields,
            or the names do not fit the columns.

    Example:

        >>> columns = csv_to_columns("mnist.csv.gz", header=False,
        ...                          column_names=["image:784", "label"])  # doctest: +SKIP
    """
    rows, header_names, width = _read_csv_rows(path, header)
    if column_names:
        groups = _parse_groups(column_names, width, path)
    else:
        names = header_names or [f"column_{i}" for i in range(width)]
        _check_unique(names, path)
        groups = [(name, None) for name in names]
    table = np.array(rows, dtype=str).reshape(len(rows), width)
    columns, first = {}, 0
    for name, count in groups:
        if count is None:
            columns[name], first = _typed(table[:, first]), first + 1
        else:
            columns[name], first = _typed(table[:, first:first + count]), first + count
    return columns


def npz_to_columns(path):
    """Reads a `.npz` file; every array in it is a column.

    Raises:
        DataError: the file is missing or not a readable `.npz` file.
    """
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError) as exc:
        raise DataError(f"Cannot read the .npz file {path}: {exc}. Received: {path!r}") from exc


def _read_csv_rows(path, header):
    opener = gzip.open if path.lower().endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as f:
            reader = csv.reader(f, skipinitialspace=True)
            rows = [row for row in reader if row]
    except OSError as exc:
        raise DataError(
            f"Cannot read the CSV file {path}: {exc.strerror or exc}. Received: {path!r}"
        ) from exc
    except (UnicodeDecodeError, csv.Error, EOFError) as exc:
        raise DataError(f"Cannot parse the CSV file {path}: {exc}. Received: {path!r}") from exc
    header_names = [name.strip() for name in rows.pop(0)] if header and rows else []
    if not rows:
        raise DataError(f"The CSV file {path} has no data rows. Received: {path!r}")
    width = len(header_names) or len(rows[0])
    for number, row in enumerate(rows):
        if len(row) != width:
            raise DataError(
                f"Every row of {path} must have {width} fields; data row {number} "
                f"(0-based, header excluded) has {len(row)}. Received: {','.join(row)[:200]!r}"
            )
    return rows, header_names, width


def _parse_groups(column_names, width, path):
    """`[(name, k or None), ...]`: None for a plain column, k for a gathered `name:k`."""
    groups = []
    for spec in column_names:
        name, _, count = spec.partition(":")
        if not name or (count and (not count.isdigit() or int(count) < 1)):
            raise DataError(
                f"A column name must be 'name' or 'name:k' with k a positive integer. "
                f"Received: {spec!r}"
            )
        groups.append((name, int(count) if count else None))
    _check_unique([name for name, _ in groups], path)
    total = sum(count or 1 for _, count in groups)
    if total != width:
        raise DataError(
            f"The column names must cover the {width} columns of {path}; they cover {total}. "
            f"Received: {','.join(column_names)!r}"
        )
    return groups


def _check_unique(names, path):
    repeated = sorted({name for name in names if names.count(name) > 1 or not name})
    if repeated:
        raise DataError(
            f"Column names of {path} must be unique and non-empty. Received: {names!r}"
        )


def _typed(values):
    """`values` (str array) as int64, else float64 (empty as NaN), else str."""
    stripped = np.char.strip(values)
    try:
        return stripped.astype(np.int64)
    except (ValueError, OverflowError):
        pass
    if (stripped != "").any():
        try:
            return np.where(stripped == "", "nan", stripped).astype(np.float64)
        except ValueError:
            pass
    return values


def _sklearn(loader_name, feature_column):
    def load():
        try:
            import sklearn.datasets
        except ImportError as exc:
            raise DataError(
                "Named sklearn data sets need scikit-learn: pip install scikit-learn. "
                f"Received: sklearn:{loader_name.removeprefix('load_')}"
            ) from exc
        data = getattr(sklearn.datasets, loader_name)()
        features = data.data.astype(np.int64 if feature_column == "image" else np.float64)
        return {feature_column: features, "label": data.target.astype(np.int64)}

    load.__doc__ = f"sklearn.datasets.{loader_name}: {feature_column!r} and 'label' columns."
    return load


def _keras(name):
    def load():
        import keras

        try:
            (x_train, y_train), (x_test, y_test) = getattr(keras.datasets, name).load_data()
        except Exception as exc:
            raise DataError(
                f"Cannot download keras:{name} (it needs network access): {exc}. "
                f"Received: keras:{name}"
            ) from exc
        images = np.concatenate([x_train, x_test]).reshape(-1, 28 * 28).astype(np.int64)
        labels = np.concatenate([y_train, y_test]).astype(np.int64)
        return {"image": images, "label": labels}

    load.__doc__ = (
        f"keras.datasets.{name} (downloaded, needs network): 70,000 rows, the 60,000 training "
        "images first; 'image' (784 pixel values 0-255) and 'label' columns."
    )
    return load


NAMED_DATASETS = {
    "sklearn:digits": _sklearn("load_digits", "image"),
    "sklearn:iris": _sklearn("load_iris", "features"),
    "sklearn:breast_cancer": _sklearn("load_breast_cancer", "features"),
    "sklearn:wine": _sklearn("load_wine", "features"),
    "keras:mnist": _keras("mnist"),
    "keras:fashion_mnist": _keras("fashion_mnist"),
}
