"""Turning a data flag's value (a file, a directory or a glob) into record file paths."""

import glob
import os

from elastic_keras.common.errors import DataError
from elastic_keras.data.index import INDEX_SUFFIX
from elastic_keras.data.reader import READERS, is_record_file, reader_class


def expand_paths(spec, flag="--training-data"):
    """Returns the sorted absolute paths of the record files that `spec` names.

    `spec` is one of:
    - a file: it must have a record extension;
    - a directory: every record file directly in it (not recursive);
    - a glob (`*`, `?`, `[...]`; `**` recurses): the record files among its matches.
    Hidden files and index files (`*.index`) are never data; `~` is expanded.

    Args:
        spec: the flag's value.
        flag: the flag's name, for error messages.

    Raises:
        DataError: `spec` matches no record file; the message lists what it did match.

    Example:

        >>> expand_paths("data/train")  # doctest: +SKIP
        ['/abs/data/train/data-00000-of-00002.tfrecord', '/abs/.../data-00001-of-00002.tfrecord']
    """
    path = os.path.expanduser(os.fspath(spec))
    if os.path.isfile(path):
        reader_class(path)  # Raises DataError for an extension that is not a record format.
        return [os.path.abspath(path)]
    if os.path.isdir(path):
        candidates = [os.path.join(path, name) for name in os.listdir(path)]
    elif glob.has_magic(path):
        candidates = glob.glob(path, recursive=True)
    else:
        raise DataError(
            f"{flag} matches no record file: no file, directory or glob pattern of that name "
            f"exists. Received: {spec!r}"
        )
    candidates = [c for c in candidates if os.path.isfile(c) and not _ignored(c)]
    records = sorted(os.path.abspath(c) for c in candidates if is_record_file(c))
    if records:
        return records
    found = sorted(os.path.basename(c) for c in candidates)
    listing = ", ".join(found[:10]) + (f" and {len(found) - 10} more" if len(found) > 10 else "")
    raise DataError(
        f"{flag} matches no record file (accepted extensions: {', '.join(READERS)}); it "
        f"matches {listing or 'no files'}. Received: {spec!r}"
    )


def _ignored(path):
    name = os.path.basename(path)
    return name.startswith(".") or name.endswith(INDEX_SUFFIX)
