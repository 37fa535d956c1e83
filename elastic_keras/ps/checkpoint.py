"""A shard's state to and from a checkpoint file, re-sharded when the shard count changed.

A shard file (`ps-{id}-of-{n}.ckpt`, see `common/checkpoint_layout.py` for the directory
layout) is a numpy `.npz` archive, an uncompressed ZIP64 file that `numpy.load(path,
allow_pickle=False)` opens. Its member `meta.json` describes the shard (format, version,
optimizer config, table configs, the dense variables' options, optimizer step count,
applied sequences and push counts) and names, for every array, the member holding it
(`a0.npy`, `a1.npy`, ...): dense values, dense optimizer slots keyed by variable and slot
name, the optimizer's other variables, and each table's ids, rows and row slots. Arrays
are plain `.npy` data (never pickles); a dtype numpy cannot describe (bfloat16) is stored
as raw bytes with its name in `meta.json`. The file is written in one pass, its CRC32C
computed on the way, then fsynced and renamed into place.

Dense variables are placed by `partition.dense_shard` and table rows by
`partition.embedding_shards`, which depend only on names, ids and the shard count; so a
checkpoint written by M shards is restored by N shards by reading all M files and keeping
what each new shard owns, slots included.

Example:

    shard = save_shard(parameters, "/ckpt/ckpt-00000003", ps_id=0, num_ps=2)
    # ... once the master has written the manifest:
    Parameters().restore(load_shards("/ckpt/ckpt-00000003", ps_id=0, num_ps=3))
"""

import dataclasses
import json
import os
import zipfile

import google_crc32c
import ml_dtypes
import numpy as np

from elastic_keras.common import partition
from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.common.checkpoint_layout import (
    ShardFile, file_crc32c, read_manifest, shard_file_name,
)
from elastic_keras.common.errors import CheckpointError
from elastic_keras.ps.embedding_table import TableState
from elastic_keras.ps.shard_types import Snapshot, TableConfig, VariableOptions

FORMAT = "elastic_keras.ps_shard"
FORMAT_VERSION = 1
_META = "meta.json"


def save_shard(parameters, ckpt_path, ps_id, num_ps, checkpoint_id=0, cut=None):
    """Writes a consistent snapshot of `parameters` to `ckpt_path/ps-{ps_id}-of-{num_ps}.ckpt`.

    The snapshot is taken under the shard's lock (at the cut of checkpoint `checkpoint_id`,
    see `Parameters.snapshot_at_cut`, when one is given); the file is written outside it,
    atomically (a crash leaves no partial file under the final name). `ckpt_path` is
    created if missing.

    Args:
        parameters: the shard's `Parameters`.
        ckpt_path: the checkpoint's directory (`CHECKPOINT_DIR/ckpt-N`).
        ps_id: this shard's index. num_ps: the number of shards in the job.
        checkpoint_id, cut: the checkpoint `prepare_checkpoint` began and its cut
            (`{worker id: highest sequence}`); 0: a snapshot of the shard as it is now.

    Returns:
        The `ShardFile` (name, size, CRC32C of the bytes written, model version) for the
        manifest.

    Raises:
        NotReadyError: the shard has no model yet.
        ValueError: `ps_id` is not in `[0, num_ps)`.
        OSError: the file cannot be written.
    """
    name = shard_file_name(ps_id, num_ps)
    snapshot = (parameters.snapshot_at_cut(checkpoint_id, cut or {}) if checkpoint_id
                else parameters.snapshot())
    os.makedirs(ckpt_path, exist_ok=True)
    with atomic_write(os.path.join(ckpt_path, name)) as f:
        writer = _ChecksummingWriter(f)
        _write(snapshot, writer, ps_id, num_ps)
    return ShardFile(file=name, bytes=writer.size, crc32c=writer.crc32c(),
                     model_version=snapshot.version)


def load_shards(ckpt_path, ps_id, num_ps):
    """The `Snapshot` of shard `ps_id` of `num_ps` from the checkpoint at `ckpt_path`.

    When the checkpoint was written by `num_ps` shards, this reads the one file; otherwise it
    reads every file (one at a time) and keeps the dense variables and table rows that shard
    `ps_id` of `num_ps` owns, with their optimizer slots. The version, the dense optimizer's
    step count and each worker's applied sequence are the highest of the files'; the
    optimizer's other variables come from the file with the highest step count. Every file
    is checked against the manifest's size and CRC32C before it is parsed.

    Raises:
        CheckpointError: no manifest, a file missing, truncated, corrupt or not a shard file,
            or files that disagree (naming the file and what is wrong).
        ValueError: `ps_id` is not in `[0, num_ps)`.
    """
    shard_file_name(ps_id, num_ps)  # checks ps_id and num_ps
    manifest = read_manifest(ckpt_path)
    if manifest["num_ps"] == num_ps:
        return _read(ckpt_path, manifest["shards"][ps_id])
    merged = _Merge(ps_id, num_ps)
    for old_id, entry in enumerate(manifest["shards"]):
        merged.add(_read(ckpt_path, entry), os.path.join(ckpt_path, entry["file"]), old_id)
    return merged.result()


class _ChecksummingWriter:
    """A write-only stream that passes bytes on and keeps their CRC32C and count.

    It has no `tell` or `seek`, so `zipfile` writes in one pass (with data descriptors).
    """

    def __init__(self, file):
        self._file = file
        self._checksum = google_crc32c.Checksum()
        self.size = 0

    def write(self, data):
        if not isinstance(data, bytes):  # the checksum takes read-only bytes
            data = bytes(data)
        self._checksum.update(data)
        self.size += len(data)
        return self._file.write(data)

    def flush(self):
        self._file.flush()

    def crc32c(self):
        return int.from_bytes(self._checksum.digest(), "big")


def _write(snapshot, stream, ps_id, num_ps):
    arrays, raw_dtypes = [], {}

    def add(array):
        key = f"a{len(arrays)}"
        array = np.asarray(array)
        if not _npy_can_hold(array.dtype):
            raw_dtypes[key] = {"dtype": array.dtype.name, "shape": list(array.shape)}
            array = np.frombuffer(np.ascontiguousarray(array).tobytes(), np.uint8)
        arrays.append((key, array))
        return key

    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "ps_id": ps_id,
        "num_ps": num_ps,
        "version": snapshot.version,
        "optimizer_config": snapshot.optimizer_config,
        "tables": [dataclasses.asdict(t) for t in snapshot.tables],
        "optimizer_iterations": snapshot.optimizer_iterations,
        "applied_sequences": {str(w): s for w, s in snapshot.applied_sequences.items()},
        "applied_pushes": {str(w): n for w, n in snapshot.applied_pushes.items()},
        "table_steps": snapshot.table_steps,
        "table_counters": snapshot.table_counters,
        "table_sketches": {name: add(counts) for name, counts in snapshot.table_sketches.items()},
        "variable_options": [dataclasses.asdict(o) for o in snapshot.variable_options.values()],
        "dense": {name: add(value) for name, value in snapshot.dense.items()},
        "optimizer_slots": {name: {slot: add(value) for slot, value in slots.items()}
                            for name, slots in snapshot.optimizer_slots.items()},
        "optimizer_others": {key: add(value) for key, value in snapshot.optimizer_others.items()},
        "table_states": {
            name: {"ids": add(state.ids), "values": add(state.values),
                   "slots": {slot: add(rows) for slot, rows in state.slots.items()},
                   **({} if state.touched is None else {"touched": add(state.touched)})}
            for name, state in snapshot.table_states.items()
        },
        "raw_dtypes": raw_dtypes,
    }
    with zipfile.ZipFile(stream, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        archive.writestr(_META, json.dumps(meta))
        for key, array in arrays:
            with archive.open(f"{key}.npy", "w", force_zip64=True) as member:
                np.lib.format.write_array(member, array, allow_pickle=False)


def _npy_can_hold(dtype):
    """Whether a `.npy` header describes `dtype` exactly (not so for bfloat16 and the like)."""
    try:
        descr = np.lib.format.dtype_to_descr(dtype)
        return dtype.kind != "V" and np.lib.format.descr_to_dtype(descr) == dtype
    except (TypeError, ValueError):
        return False


def _read(ckpt_path, entry):
    """The `Snapshot` in the shard file of manifest `entry`, checked against the entry."""
    file = os.path.join(ckpt_path, entry["file"])
    try:
        crc, size = file_crc32c(file)
    except OSError as exc:
        raise CheckpointError(f"Shard file {file} cannot be read: {exc}") from exc
    if size != entry["bytes"] or crc != entry["crc32c"]:
        raise CheckpointError(
            f"Shard file {file} is truncated or corrupt: {size} bytes with CRC32C {crc}; the "
            f"manifest records {entry['bytes']} bytes with CRC32C {entry['crc32c']}."
        )
    try:
        with np.load(file, allow_pickle=False) as archive:
            snapshot, meta = _parse(archive, file)
        written_as = shard_file_name(meta["ps_id"], meta["num_ps"])
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, TypeError, AttributeError,
            zipfile.BadZipFile) as exc:
        raise CheckpointError(f"Shard file {file} is not a readable shard file "
                              f"({type(exc).__name__}: {exc}).") from exc
    if written_as != entry["file"]:
        raise CheckpointError(f"Shard file {file} was written as {written_as}.")
    return snapshot


def _parse(archive, file):
    """(the `Snapshot` in an open shard archive, its metadata)."""
    meta = json.loads(archive[_META])
    if meta.get("format") != FORMAT or meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"Shard file {file} is not in format {FORMAT} version {FORMAT_VERSION}. Received: "
            f"format {meta.get('format')!r} version {meta.get('format_version')!r}"
        )
    raw = meta["raw_dtypes"]

    def get(key):
        array = archive[key]
        if key in raw:
            dtype = np.dtype(getattr(ml_dtypes, raw[key]["dtype"]))
            array = array.view(dtype).reshape(raw[key]["shape"])
        return array

    snapshot = Snapshot(
        version=int(meta["version"]),
        optimizer_config=meta["optimizer_config"],
        tables=tuple(TableConfig(**t) for t in meta["tables"]),
        dense={name: get(key) for name, key in meta["dense"].items()},
        optimizer_iterations=int(meta["optimizer_iterations"]),
        optimizer_slots={name: {slot: get(key) for slot, key in slots.items()}
                         for name, slots in meta["optimizer_slots"].items()},
        optimizer_others={name: get(key) for name, key in meta["optimizer_others"].items()},
        table_states={
            name: TableState(ids=get(t["ids"]), values=get(t["values"]),
                             slots={slot: get(key) for slot, key in t["slots"].items()},
                             touched=get(t["touched"]) if "touched" in t else None)
            for name, t in meta["table_states"].items()
        },
        applied_sequences={int(w): int(s) for w, s in meta["applied_sequences"].items()},
        # Files written before options and push counts were kept have neither.
        variable_options={o["name"]: VariableOptions(**o)
                          for o in meta.get("variable_options", [])},
        applied_pushes={int(w): int(n) for w, n in meta.get("applied_pushes", {}).items()},
        table_steps=meta.get("table_steps"),
        table_counters=meta.get("table_counters", {}),
        table_sketches={name: get(key) for name, key in meta.get("table_sketches", {}).items()},
    )
    return snapshot, meta


class _Merge:
    """Collects, from the snapshots of another shard count, what one new shard owns."""

    def __init__(self, ps_id, num_ps):
        self._ps_id, self._num_ps = ps_id, num_ps
        self._first = None
        self._version = self._steps = 0
        self._iterations, self._others = -1, {}
        self._dense, self._slots, self._sources = {}, {}, {}
        self._rows = {}
        self._sequences = {}
        self._pushes = {}
        self._options = {}
        self._counters = {}
        self._sketches = {}

    def add(self, snapshot, file, old_id):
        """Keeps the parts of `snapshot` (read from `file`, written by shard `old_id`) that
        the new shard owns."""
        first = self._first
        if first is None:
            self._first = first = snapshot
            self._rows = {t.name: [] for t in snapshot.tables}
        elif (_optimizer_spec(snapshot), snapshot.tables) != (_optimizer_spec(first),
                                                               first.tables):
            raise CheckpointError(
                f"Shard file {file} was written with another optimizer or other embedding "
                "tables than the checkpoint's first shard; the files come from different jobs."
            )
        self._version = max(self._version, snapshot.version)
        steps = snapshot.version if snapshot.table_steps is None else snapshot.table_steps
        self._steps = max(self._steps, steps)
        if snapshot.optimizer_iterations > self._iterations:
            self._iterations, self._others = (snapshot.optimizer_iterations,
                                              snapshot.optimizer_others)
        for worker, sequence in snapshot.applied_sequences.items():
            self._sequences[worker] = max(sequence, self._sequences.get(worker, sequence))
        # Push counts are per shard; a new shard holds parts of several: the most of any.
        for worker, count in snapshot.applied_pushes.items():
            self._pushes[worker] = max(count, self._pushes.get(worker, count))
        for name, value in snapshot.dense.items():
            if partition.dense_shard(name, self._num_ps) != self._ps_id:
                continue
            if name in self._dense:
                raise CheckpointError(f"Dense variable {name!r} is in both "
                                      f"{self._sources[name]} and {file}.")
            self._dense[name], self._sources[name] = value, file
            if name in snapshot.variable_options:
                self._options[name] = snapshot.variable_options[name]
            if name in snapshot.optimizer_slots:
                self._slots[name] = snapshot.optimizer_slots[name]
        for name, state in snapshot.table_states.items():
            if name not in self._rows:
                raise CheckpointError(f"Shard file {file} holds rows of table {name!r}, which "
                                      f"its tables {[t.name for t in first.tables]} lack.")
            owned = partition.embedding_shards(name, state.ids, self._num_ps) == self._ps_id
            self._rows[name].append(TableState(
                ids=state.ids[owned], values=state.values[owned],
                slots={slot: rows[owned] for slot, rows in state.slots.items()},
                touched=None if state.touched is None else state.touched[owned],
            ))
        # Counts cannot be split by id: each new shard takes those of every num_ps-th old
        # one, so the job's totals stay what they were.
        if old_id % self._num_ps == self._ps_id:
            for name, counts in snapshot.table_counters.items():
                total = self._counters.setdefault(name, dict.fromkeys(counts, 0))
                for key, value in counts.items():
                    total[key] = total.get(key, 0) + value
        # Sightings of every old shard's ids, added (saturating): more than each id's own,
        # as a count-min sketch's counts may be; sketches of another width are left out.
        for name, counts in snapshot.table_sketches.items():
            held = self._sketches.setdefault(name, np.zeros_like(counts))
            if held.shape == counts.shape:
                self._sketches[name] = np.minimum(held.astype(np.int64) + counts,
                                                  255).astype(counts.dtype)

    def result(self):
        first = self._first
        return Snapshot(
            version=self._version,
            optimizer_config=first.optimizer_config,
            tables=first.tables,
            dense=self._dense,
            optimizer_iterations=self._iterations,
            optimizer_slots=self._slots,
            optimizer_others=self._others,
            table_states={name: _concatenate(parts) for name, parts in self._rows.items()},
            applied_sequences=self._sequences,
            variable_options=self._options,
            applied_pushes=self._pushes,
            table_steps=self._steps,
            table_counters=self._counters,
            table_sketches=self._sketches,
        )


def _optimizer_spec(snapshot):
    """The optimizer config without its name (workers' optimizers may be named apart)."""
    spec = json.loads(snapshot.optimizer_config)
    if isinstance(spec.get("config"), dict):
        spec["config"].pop("name", None)
    return spec


def _concatenate(states):
    return TableState(
        ids=np.concatenate([s.ids for s in states]),
        values=np.concatenate([s.values for s in states]),
        slots={slot: np.concatenate([s.slots[slot] for s in states])
               for slot in states[0].slots},
        touched=(None if any(s.touched is None for s in states)
                 else np.concatenate([s.touched for s in states])),
    )
