"""The on-disk layout of checkpoints, shared by the master and the parameter servers.

A checkpoint is one directory holding one file per parameter-server shard and, written last,
a manifest; the manifest's presence makes the checkpoint complete:

    CHECKPOINT_DIR/
      ckpt-00000012/           one checkpoint, numbered by the master (8 digits)
        ps-0-of-2.ckpt         shard 0's state, written by PS 0 atomically
        ps-1-of-2.ckpt
        MANIFEST.json          written by the master last, atomically

`MANIFEST.json` is a JSON object with at least `number`, `num_ps`, `created` (Unix time) and
`shards`, one `{"file", "bytes", "crc32c", "model_version"}` entry per shard in shard order,
plus whatever else the writer adds (the master keeps its job state under `"job_state"`).
Every file is written to a hidden temporary file and renamed (`atomic_write`), so a crash
leaves either no file or a whole one; what a reader cannot trust (a missing or short shard
file, a bad checksum) makes the checkpoint incomplete and `latest_complete` falls back to
the previous one. This module does not import TensorFlow.

Example:

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> path = checkpoint_path(root, next_number(root))
    >>> os.path.basename(path), shard_file_name(0, 2)
    ('ckpt-00000001', 'ps-0-of-2.ckpt')
    >>> latest_complete(root) is None
    True
"""

import dataclasses
import json
import logging
import os
import re
import shutil
import time

import google_crc32c

from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.common.errors import CheckpointError

logger = logging.getLogger(__name__)

MANIFEST = "MANIFEST.json"
_CHECKPOINT_DIR = re.compile(r"ckpt-(\d{8,})")
_SHARD_KEYS = ("file", "bytes", "crc32c", "model_version")
_BLOCK_BYTES = 4 << 20


@dataclasses.dataclass(frozen=True)
class ShardFile:
    """One shard's file in a checkpoint, as its manifest entry records it."""

    file: str
    bytes: int
    crc32c: int
    model_version: int


def checkpoint_path(root, number):
    """The directory of checkpoint `number` under `root`: `root/ckpt-0000000N`.

    Raises:
        ValueError: `number` is not a positive integer.
    """
    if isinstance(number, bool) or not isinstance(number, int) or number < 1:
        raise ValueError(f"A checkpoint number must be a positive integer. Received: {number!r}")
    return os.path.join(root, f"ckpt-{number:08d}")


def shard_file_name(ps_id, num_ps):
    """The name of shard `ps_id`'s file in a checkpoint of `num_ps` shards: `ps-0-of-2.ckpt`.

    Raises:
        ValueError: `ps_id` is not in `[0, num_ps)`.
    """
    if num_ps < 1 or not 0 <= ps_id < num_ps:
        raise ValueError(f"ps_id must be in [0, num_ps) with num_ps >= 1. "
                         f"Received: ps_id={ps_id}, num_ps={num_ps}")
    return f"ps-{ps_id}-of-{num_ps}.ckpt"


def file_crc32c(path):
    """The CRC32C of the file at `path` (read in blocks) and its size: `(crc, bytes)`.

    Raises:
        OSError: the file cannot be read.
    """
    checksum = google_crc32c.Checksum()
    size = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK_BYTES):
            checksum.update(block)
            size += len(block)
    return int.from_bytes(checksum.digest(), "big"), size


def write_manifest(path, manifest):
    """Writes `manifest` to `path/MANIFEST.json` atomically, completing the checkpoint.

    Args:
        path: the checkpoint's directory (it must exist: the shards are written first).
        manifest: a JSON-serialisable dict with `number`, `num_ps` and `shards` (dicts or
            `ShardFile`s, one per shard in shard order), and any other keys to keep;
            `created` defaults to now.

    Raises:
        CheckpointError: the manifest lacks a key or its shards do not match `num_ps`.
        OSError: the file cannot be written.
    """
    manifest = dict(manifest)
    manifest["shards"] = [dataclasses.asdict(s) if isinstance(s, ShardFile) else dict(s)
                          for s in manifest.get("shards", ())]
    manifest.setdefault("created", time.time())
    _check_manifest(manifest, f"the manifest for {path}")
    with atomic_write(os.path.join(path, MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.write("\n")


def read_manifest(path):
    """The manifest of the checkpoint at `path`, as a dict.

    Raises:
        CheckpointError: `path/MANIFEST.json` is missing (an incomplete checkpoint), not JSON,
            or lacks what `write_manifest` requires.
    """
    file = os.path.join(path, MANIFEST)
    try:
        with open(file, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as exc:
        raise CheckpointError(
            f"{file} does not exist: the checkpoint is incomplete (the manifest is written "
            "last)."
        ) from exc
    except OSError as exc:
        raise CheckpointError(f"Cannot read {file}: {exc}") from exc
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise CheckpointError(f"{file} is not valid JSON ({exc}).") from exc
    _check_manifest(manifest, file)
    return manifest


def _check_manifest(manifest, what):
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{what} must be a JSON object. "
                              f"Received: {type(manifest).__name__}")
    missing = [key for key in ("number", "num_ps", "shards", "created") if key not in manifest]
    if missing:
        raise CheckpointError(f"{what} lacks {missing}. Received keys: {sorted(manifest)}")
    num_ps, shards = manifest["num_ps"], manifest["shards"]
    if not isinstance(num_ps, int) or num_ps < 1 or not isinstance(shards, list) \
            or len(shards) != num_ps:
        raise CheckpointError(
            f"{what}: num_ps must be a positive integer and shards a list of that many "
            f"entries. Received: num_ps={num_ps!r}, "
            f"{len(shards) if isinstance(shards, list) else type(shards).__name__} shards"
        )
    for ps_id, shard in enumerate(shards):
        if not isinstance(shard, dict) or any(key not in shard for key in _SHARD_KEYS):
            raise CheckpointError(f"{what}: shard {ps_id} needs the keys {list(_SHARD_KEYS)}. "
                                  f"Received: {shard!r}")
        if shard["file"] != shard_file_name(ps_id, num_ps):
            raise CheckpointError(
                f"{what}: shard {ps_id}'s file must be {shard_file_name(ps_id, num_ps)!r}. "
                f"Received: {shard['file']!r}"
            )


def list_checkpoints(root):
    """Every `(number, path)` of a `ckpt-N` directory in `root`, by number; [] when none.

    Other entries (temporary files, unrelated names, plain files) are ignored.
    """
    try:
        entries = os.listdir(root)
    except FileNotFoundError:
        return []
    found = []
    for entry in entries:
        match = _CHECKPOINT_DIR.fullmatch(entry)
        path = os.path.join(root, entry)
        if match and os.path.isdir(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def check_complete(path, verify=True):
    """The manifest of the checkpoint at `path` once its shard files are checked.

    Every shard file must exist with the size the manifest records and, with `verify`, the
    recorded CRC32C (the files are read whole).

    Raises:
        CheckpointError: the manifest or a shard file is missing or wrong (naming which).
    """
    manifest = read_manifest(path)
    for shard in manifest["shards"]:
        file = os.path.join(path, shard["file"])
        try:
            size = os.path.getsize(file)
            if size == shard["bytes"] and verify:
                crc, size = file_crc32c(file)
        except OSError as exc:
            raise CheckpointError(f"Shard file {file} cannot be read: {exc}") from exc
        if size != shard["bytes"]:
            raise CheckpointError(f"Shard file {file} has {size} bytes; the manifest records "
                                  f"{shard['bytes']} (truncated or replaced).")
        if verify and crc != shard["crc32c"]:
            raise CheckpointError(f"Shard file {file} has CRC32C {crc}; the manifest records "
                                  f"{shard['crc32c']} (corrupt).")
    return manifest


def latest_complete(root, verify=True):
    """The newest complete checkpoint in `root` as `(path, manifest)`, or None.

    Newest first, each checkpoint is checked with `check_complete`; one that fails is skipped
    with a warning saying why, and the previous one is tried.
    """
    for _, path in reversed(list_checkpoints(root)):
        try:
            return path, check_complete(path, verify)
        except CheckpointError as exc:
            logger.warning("Skipping checkpoint %s: %s", path, exc)
    return None


def prune(root, keep_max):
    """Deletes old checkpoints; returns the paths removed, oldest first.

    Keeps the newest `keep_max` complete checkpoints (0: all of them) and deletes the older
    complete ones, and every incomplete one older than the newest complete one (a newer one
    may still be being written). The newest complete one is never deleted. "Complete" means
    `check_complete` without reading whole files (manifest, shard files and sizes).
    """
    if keep_max < 0:
        raise ValueError(f"keep_max must be 0 (keep all) or more. Received: {keep_max}")
    complete, incomplete = [], []
    for number, path in list_checkpoints(root):
        try:
            check_complete(path, verify=False)
            complete.append((number, path))
        except CheckpointError:
            incomplete.append((number, path))
    if not complete:
        return []
    newest = complete[-1][0]
    doomed = [c for c in incomplete if c[0] < newest]
    if keep_max:
        doomed += complete[:-keep_max]
    removed = []
    for _, path in sorted(doomed):
        try:
            shutil.rmtree(path)
            removed.append(path)
        except OSError as exc:
            logger.warning("Cannot delete old checkpoint %s: %s", path, exc)
    return removed


def next_number(root):
    """One more than the highest checkpoint number in `root` (complete or not); 1 when none."""
    found = list_checkpoints(root)
    return found[-1][0] + 1 if found else 1
