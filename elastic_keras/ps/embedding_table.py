"""One embedding table on a parameter-server shard: rows created on first use, updated sparsely.

Rows live in one contiguous `[capacity, dim]` array and each optimizer slot in a parallel array
of the same shape, all indexed by the row's slot; an `IdMap` gives each id its slot. A row is
created the first time an id is read or updated, with the layer's initializer
(`embedding_init.initial_rows`, deterministic per id) and its slots at the optimizer's initial
values. Only rows a gradient touches, and their slots, change (see `sparse_optimizers`).
Rows can be removed (`remove`), or evicted when idle for some update steps or beyond a row
budget, least recently updated first (`evict`: each row keeps the step it last changed at,
8 bytes); a removed id that returns is a new row, and its place in the arrays is reused, so
a table evicting as fast as new ids arrive keeps its memory.
The arrays grow geometrically by `GROWTH`, in place where the allocator can extend them, and
ask the kernel for huge pages (as numpy does for the large arrays it allocates itself), which
cuts the TLB misses of a step's random row reads (a gather of 64k rows of 10M took a quarter
less time so).

Not thread-safe: the shard serialises calls.

Example:

    >>> import numpy as np
    >>> from elastic_keras.ps.sparse_optimizers import from_keras_config
    >>> sgd = from_keras_config({"class_name": "SGD", "config": {"learning_rate": 1.0}})
    >>> table = EmbeddingTable("user", 2, "zeros")
    >>> table.apply(np.array([5, 5, 9]), np.ones((3, 2), np.float32), sgd, step=1)
    >>> table.rows(np.array([5, 9, 1])).tolist()
    [[-2.0, -2.0], [-1.0, -1.0], [0.0, 0.0]]
    >>> table.num_rows
    3
"""

import ctypes
import mmap
import sys
import typing

import numpy as np

from elastic_keras.common.embedding_init import check_initializer, initial_rows
from elastic_keras.common.errors import DataError, PayloadError
from elastic_keras.ps.id_map import IdMap

GROWTH = 1.25
_MIN_CAPACITY = 1024
_MADV_HUGEPAGE = 14  # Linux


class TableState(typing.NamedTuple):
    """A table's content as plain arrays: `ids[i]`'s row is `values[i]`, its slots `slots[n][i]`."""

    ids: np.ndarray
    values: np.ndarray
    slots: dict


class EmbeddingTable:
    """The rows of one embedding table held by one shard; see the module docstring.

    Args:
        name: the table's name (also seeds the row initializer).
        dim: the row width.
        initializer: the layer's initializer, as `embedding_init.initial_rows` takes it.
        input_dim: the layer's `input_dim`; ids must lie in `[0, input_dim)`. 0: unbounded.
        dtype: the floating-point dtype of rows and slots.
        slot_names: the optimizer slots to keep per row (`SparseOptimizer.slot_names`).
        slot_initial_values: `{slot name: value}` new rows start from; 0 where absent
            (`SparseOptimizer.slot_initial_value`).

    Raises:
        ModelSpecError: the initializer cannot create rows for this table.
        ValueError: a bad name, dim, input_dim, dtype or slot name.
    """

    def __init__(self, name, dim, initializer, input_dim=0, dtype=np.float32, slot_names=(),
                 slot_initial_values=None):
        dtype = np.dtype(dtype)
        if not name or not isinstance(name, str):
            raise ValueError(f"A table needs a non-empty name. Received: name={name!r}")
        if int(dim) != dim or dim < 1:
            raise ValueError(f"Table {name!r}: dim must be a positive integer. Received: {dim}")
        if int(input_dim) != input_dim or input_dim < 0:
            raise ValueError(
                f"Table {name!r}: input_dim must be 0 (unbounded) or positive. "
                f"Received: {input_dim}"
            )
        if not np.issubdtype(dtype, np.floating):
            raise ValueError(f"Table {name!r}: dtype must be floating. Received: {dtype}")
        initial = dict(slot_initial_values or {})
        unknown = sorted(set(initial) - set(slot_names))
        if unknown or len(set(slot_names)) != len(slot_names):
            raise ValueError(
                f"Table {name!r}: slot names must be distinct and cover slot_initial_values. "
                f"Received: slot_names={list(slot_names)}, slot_initial_values={initial}"
            )
        check_initializer(initializer, input_dim)
        self.name, self.dim, self.input_dim, self.dtype = name, int(dim), int(input_dim), dtype
        self.initializer = initializer
        self.slot_names = tuple(slot_names)
        self._slot_initial = {slot: float(initial.get(slot, 0.0)) for slot in self.slot_names}
        self._ids = IdMap()
        self._values = np.empty((0, self.dim), dtype=dtype)
        self._slots = {slot: np.empty((0, self.dim), dtype=dtype) for slot in self.slot_names}
        self._step = 0  # the latest update step applied
        self._touched = np.zeros(0, dtype=np.int64)  # per slot: the step its row last changed

    @property
    def num_rows(self):
        """How many rows the table holds."""
        return len(self._ids)

    @property
    def capacity(self):
        """How many rows the arrays have room for (removed rows' places are reused)."""
        return len(self._values)

    @property
    def nbytes(self):
        """Bytes held: rows, slots and the id map (allocated capacity, not only used rows)."""
        arrays = self._values.nbytes + sum(a.nbytes for a in self._slots.values())
        return arrays + self._touched.nbytes + self._ids.nbytes

    def rows(self, ids):
        """The rows of `ids` (a copy, shape `[*ids.shape, dim]`), creating missing ones.

        Raises:
            PayloadError: ids are not integers, or outside `[0, input_dim)` for a bounded table.
        """
        ids = self._check_ids(ids)
        slots = self._slots_of(ids.reshape(-1))
        return np.take(self._values, slots, axis=0).reshape(*ids.shape, self.dim)

    def apply(self, ids, grads, optimizer, step, lr_scale=1.0):
        """Applies one optimizer step to the rows of `ids`; repeated ids' gradients are summed.

        Everything is checked before anything changes. Rows not yet present are created first
        (as a lookup would) and then updated.

        Args:
            ids: 1-D integer ids.
            grads: `[len(ids), dim]` gradients, castable to the table's dtype.
            optimizer: a `SparseOptimizer` whose slots this table keeps.
            step: the shard's 1-based update count, including this update.
            lr_scale: a factor on this update's learning rate.

        Raises:
            PayloadError: bad ids (see `rows`), or grads of the wrong shape or dtype.
            ValueError: the optimizer needs a slot the table does not keep.
        """
        ids = self._check_ids(ids)
        if ids.ndim != 1:
            raise PayloadError(
                f"Table {self.name!r}: gradient ids must be 1-D. Received: shape={list(ids.shape)}"
            )
        grads = np.asarray(grads)
        if grads.shape != (len(ids), self.dim):
            raise PayloadError(
                f"Table {self.name!r}: gradients must have shape [number of ids, dim] = "
                f"{[len(ids), self.dim]}. Received: shape={list(grads.shape)}"
            )
        if not np.can_cast(grads.dtype, self.dtype, casting="same_kind"):
            raise PayloadError(
                f"Table {self.name!r}: gradients must be castable to {self.dtype.name}. "
                f"Received: dtype={grads.dtype.name}"
            )
        missing = sorted(set(optimizer.slot_names) - set(self.slot_names))
        if missing:
            raise ValueError(
                f"Table {self.name!r} keeps the slots {list(self.slot_names)}; "
                f"{type(optimizer).__name__} needs {list(optimizer.slot_names)}. "
                f"Received: an optimizer needing {missing}"
            )
        if not len(ids):
            return
        ids, grads = _sum_repeated(ids, grads.astype(self.dtype, copy=False))
        slots = self._slots_of(ids)
        values = np.take(self._values, slots, axis=0)
        slot_rows = {name: np.take(self._slots[name], slots, axis=0)
                     for name in optimizer.slot_names}
        optimizer.apply(values, slot_rows, grads, step, lr_scale)
        self._step = max(self._step, int(step))
        self._touched[slots] = self._step
        _scatter(self._values, slots, values)
        for name, rows in slot_rows.items():
            _scatter(self._slots[name], slots, rows)

    def export(self, chunk_rows=65536):
        """Yields `(ids, rows)` copies of every row, at most `chunk_rows` at a time, by slot.

        The table must not change while the iterator is in use.
        """
        ids, slots = self._ids.items()
        for start in range(0, len(ids), chunk_rows):
            chunk = slots[start:start + chunk_rows]
            yield ids[start:start + chunk_rows], np.take(self._values, chunk, axis=0)

    def state(self):
        """A `TableState` copy of every row and slot, for checkpoints."""
        ids, slots = self._ids.items()
        return TableState(
            ids=ids,
            values=np.take(self._values, slots, axis=0),
            slots={name: np.take(array, slots, axis=0) for name, array in self._slots.items()},
        )

    def evict(self, max_rows=None, idle_steps=None):
        """Removes the rows not updated in the last `idle_steps` update steps, then, while
        more than `max_rows` remain, the least recently updated ones (a row created by a
        lookup counts as updated then). Returns the ids removed."""
        ids, slots = self._ids.items()
        touched = self._touched[slots]
        drop = np.zeros(len(ids), dtype=bool)
        if idle_steps is not None:
            drop = self._step - touched > idle_steps
        kept = np.flatnonzero(~drop)
        extra = len(kept) - max_rows if max_rows is not None else 0
        if extra > 0:
            drop[kept[np.argpartition(touched[kept], extra - 1)[:extra]]] = True
        self._ids.remove(ids[drop])
        return ids[drop]

    def remove(self, ids):
        """Removes the rows of `ids` (absent ones are skipped) with their slots; their
        places in the arrays go to the next rows created. Returns how many were removed."""
        return int(np.count_nonzero(self._ids.remove(self._check_ids(ids)) >= 0))

    @classmethod
    def from_state(cls, name, initializer, ids, values, slots=None, input_dim=0,
                   slot_initial_values=None):
        """A table holding `ids` with rows `values` and slot rows `slots` (`{name: array}`).

        `dim` and `dtype` come from `values`; the slot names from `slots`. The arrays are
        copied (or cast) into the table's own.

        Raises:
            DataError: the arrays disagree in shape, ids repeat or lie outside `input_dim`.
        """
        ids, values, slots = np.asarray(ids), np.asarray(values), dict(slots or {})
        what = f"Table {name!r} state"
        if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
            raise DataError(f"{what}: ids must be a 1-D integer array. Received: "
                            f"shape={list(ids.shape)}, dtype={ids.dtype}")
        if values.ndim != 2 or len(values) != len(ids):
            raise DataError(f"{what}: values must have shape [{len(ids)}, dim]. "
                            f"Received: shape={list(values.shape)}")
        for slot, array in slots.items():
            if np.shape(array) != values.shape:
                raise DataError(f"{what}: slot {slot!r} must have the values' shape "
                                f"{list(values.shape)}. Received: {list(np.shape(array))}")
        table = cls(name, values.shape[1], initializer, input_dim, values.dtype, tuple(slots),
                    slot_initial_values)
        try:
            table._check_ids(ids)
        except PayloadError as exc:
            raise DataError(f"{what}: {exc}") from exc
        table._ids = IdMap(len(ids))
        table._ids.insert(ids)  # distinct ids get the slots 0, 1, 2, ... in order
        if len(table._ids) != len(ids):
            raise DataError(f"{what}: ids must be distinct. Received: {len(ids)} ids, "
                            f"{len(table._ids)} distinct")
        table._values = np.array(values, dtype=table.dtype, order="C")
        table._touched = np.zeros(len(ids), dtype=np.int64)
        table._slots = {
            slot: np.array(array, dtype=table.dtype, order="C") for slot, array in slots.items()
        }
        return table

    def _check_ids(self, ids):
        ids = np.asarray(ids)
        if ids.dtype != np.int64:
            if ids.size and not np.issubdtype(ids.dtype, np.integer):
                raise PayloadError(f"Table {self.name!r}: ids must be integers. "
                                   f"Received: dtype={ids.dtype}")
            ids = ids.astype(np.int64)
        if self.input_dim and ids.size:
            low, high = int(ids.min()), int(ids.max())
            if low < 0 or high >= self.input_dim:
                bad = low if low < 0 else high
                raise PayloadError(
                    f"Table {self.name!r}: ids must lie in [0, input_dim) = "
                    f"[0, {self.input_dim}). Received: id {bad}"
                )
        return ids

    def _slots_of(self, ids):
        """The slot of each id (1-D), creating the rows of absent ids."""
        slots = self._ids.lookup(ids)
        absent = slots < 0
        if not absent.any():
            return slots
        new_ids, positions = _distinct(ids[absent])
        # The only step that may fail, before any change.
        self._reserve(self._ids.slots_after_insert(len(new_ids)))
        new_slots = self._ids.insert(new_ids)
        slots[absent] = new_slots[positions]
        created = _as_slice(new_slots)
        self._touched[created] = self._step
        self._values[created] = initial_rows(
            self.name, new_ids, self.dim, self.initializer, self.input_dim, self.dtype)
        for name, array in self._slots.items():
            array[created] = self._slot_initial[name]
        return slots

    def _reserve(self, rows):
        """Makes room for `rows` rows, growing each array by at least `GROWTH`.

        Each array is checked on its own, so a call that ran out of memory halfway leaves a
        consistent table that the next call finishes growing.
        """
        if rows <= self.capacity and all(len(a) >= rows for a in (self._touched,
                                                                 *self._slots.values())):
            return
        shape = (max(rows, int(self.capacity * GROWTH), _MIN_CAPACITY), self.dim)
        # `resize` extends a buffer in place (for large arrays usually without copying) when
        # nothing else refers to the array. It counts references, so it is called on the
        # attributes themselves, not through a helper's argument.
        if len(self._values) < rows:
            try:
                self._values.resize(shape, refcheck=True)
            except ValueError:
                self._values = _copy_grown(self._values, shape)
        if len(self._touched) < rows:
            try:
                self._touched.resize(shape[:1], refcheck=True)
            except ValueError:
                self._touched = _copy_grown(self._touched, shape[:1])
        for name in self.slot_names:
            if len(self._slots[name]) < rows:
                try:
                    self._slots[name].resize(shape, refcheck=True)
                except ValueError:
                    self._slots[name] = _copy_grown(self._slots[name], shape)
        for array in (self._values, *self._slots.values()):
            _advise_huge_pages(array)


def _advise_huge_pages(array):
    """Asks Linux to back `array`'s pages with huge pages where it can; elsewhere, or where
    transparent huge pages are off, nothing changes."""
    if _LIBC is None or array.nbytes < 4 << 20:
        return
    start = array.ctypes.data // mmap.PAGESIZE * mmap.PAGESIZE
    _LIBC.madvise(start, array.ctypes.data + array.nbytes - start, _MADV_HUGEPAGE)


if sys.platform.startswith("linux"):
    _LIBC = ctypes.CDLL(None)
    _LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
else:
    _LIBC = None


def _copy_grown(array, shape):
    grown = np.empty(shape, dtype=array.dtype)
    grown[:len(array)] = array
    return grown


def _as_slice(slots):
    """`slots` as a slice where they are consecutive (a faster write), else as they are."""
    if len(slots) and slots[-1] - slots[0] == len(slots) - 1 and np.all(np.diff(slots) == 1):
        return slice(int(slots[0]), int(slots[-1]) + 1)
    return slots


def _scatter(array, slots, rows):
    """`array[slots] = rows` for distinct slots, copying whole rows at once."""
    row = np.dtype((np.void, array.shape[1] * array.itemsize))
    rows = np.ascontiguousarray(rows, dtype=array.dtype)
    array.view(row).reshape(-1)[slots] = rows.view(row).reshape(-1)


def _distinct(ids):
    """The distinct ids, and the index of each id among them.

    Ids usually arrive distinct (workers deduplicate): a sort tells, and they are returned as
    they are; otherwise they come back sorted.
    """
    ordered = np.sort(ids)
    if not np.any(ordered[1:] == ordered[:-1]):
        return ids, np.arange(len(ids))
    return np.unique(ids, return_inverse=True)


def _sum_repeated(ids, grads):
    """One gradient row per distinct id, the rows of a repeated id added."""
    distinct, positions = _distinct(ids)
    if len(distinct) == len(ids):
        return ids, grads
    summed = np.zeros((len(distinct), grads.shape[1]), dtype=grads.dtype)
    np.add.at(summed, positions, grads)
    return distinct, summed
