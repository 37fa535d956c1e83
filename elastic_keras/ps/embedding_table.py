"""One embedding table on a parameter-server shard: rows created on first use, updated sparsely.

Rows live in one contiguous `[capacity, dim]` array and each optimizer slot in a parallel array
of the same shape, all indexed by the row's slot; an `IdMap` gives each id its slot. A row is
created the first time an id is read or updated, with the layer's initializer
(`embedding_init.initial_rows`, deterministic per id) and its slots at the optimizer's initial
values. Only rows a gradient touches, and their slots, change (see `sparse_optimizers`).
Rows can be removed (`remove`), or evicted when idle for some update steps or beyond a row
budget, least recently used first (`evict`: each row keeps the update step it was last used
at in training, 4 bytes); a removed id that returns is a new row, and its place in the
arrays is reused, so a table evicting as fast as new ids arrive keeps its memory. A table's
`Lifecycle` (`table_lifecycle`) makes this automatic: ids are admitted before they get a
row, and a table at its row budget evicts before it grows.
The arrays grow geometrically by `GROWTH`, in place where the allocator can extend them, and
ask the kernel for huge pages (as numpy does for the large arrays it allocates itself), which
cuts the TLB misses of a step's random row reads (a gather of 64k rows of 10M took a quarter
less time so). Not thread-safe: the shard serialises calls.

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

import typing

import numpy as np

from elastic_keras.common.embedding_init import check_initializer, initial_rows
from elastic_keras.common.errors import DataError, PayloadError
from elastic_keras.ps.id_map import IdMap
from elastic_keras.ps.row_arrays import (
    advise_huge_pages, as_slice, distinct, grow, release_free_memory, scatter, sum_repeated,
)
from elastic_keras.ps.table_lifecycle import (
    EVICTION_BATCH, Admission, Lifecycle, Recency, TableCounters,
)

GROWTH = 1.25
_MIN_CAPACITY = 1024


class TableState(typing.NamedTuple):
    """A table as plain arrays: `ids[i]`'s row `values[i]`, slots `slots[n][i]`, last used
    at the update step `touched[i]` (None: unknown)."""

    ids: np.ndarray
    values: np.ndarray
    slots: dict
    touched: np.ndarray = None


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
        lifecycle: the table's admission and eviction on this shard (`table_lifecycle`).

    Raises:
        ModelSpecError: the initializer cannot create rows for this table.
        ValueError: a bad name, dim, input_dim, dtype or slot name.
    """

    def __init__(self, name, dim, initializer, input_dim=0, dtype=np.float32, slot_names=(),
                 slot_initial_values=None, lifecycle=Lifecycle()):
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
        self._ids = IdMap(most=lifecycle.max_rows)
        self._values = np.empty((0, self.dim), dtype=dtype)
        self._slots = {slot: np.empty((0, self.dim), dtype=dtype) for slot in self.slot_names}
        self._step = 0  # the latest update step applied
        self._recency = Recency()  # per slot: the step its row was last used at
        self.lifecycle = lifecycle
        self.admission = Admission.of(lifecycle, seed=name)  # None: every id admitted
        self.counters = TableCounters()

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
        """Bytes held: rows, slots, recency, the id map and the admission counters
        (allocated capacity, not only used rows)."""
        arrays = self._values.nbytes + sum(a.nbytes for a in self._slots.values())
        sketch = self.admission.nbytes if self.admission is not None else 0
        return arrays + self._recency.steps.nbytes + self._ids.nbytes + sketch

    def rows(self, ids, training=True):
        """The rows of `ids` (a copy, shape `[*ids.shape, dim]`).

        In training a lookup is a use of each row (for eviction) and an id without a row is
        offered admission: admitted, it gets a new row; not admitted, it reads zeros. Outside
        training (evaluation, prediction) nothing changes: an id without a row reads the row
        it would be created with, or zeros where the table has an admission policy.

        Raises:
            PayloadError: ids are not integers, or outside `[0, input_dim)` for a bounded table.
        """
        ids = self._check_ids(ids)
        flat = ids.reshape(-1)
        slots = self._slots_of(flat) if training else self._ids.lookup(flat)
        absent = slots < 0
        if not absent.any():
            return np.take(self._values, slots, axis=0).reshape(*ids.shape, self.dim)
        out = np.zeros((len(flat), self.dim), dtype=self.dtype)
        present = np.flatnonzero(~absent)
        out[present] = np.take(self._values, slots[present], axis=0)
        if self.admission is None:
            out[absent] = initial_rows(self.name, flat[absent], self.dim, self.initializer,
                                       self.input_dim, self.dtype)
        return out.reshape(*ids.shape, self.dim)

    def apply(self, ids, grads, optimizer, step, lr_scale=1.0):
        """Applies one optimizer step to the rows of `ids`; repeated ids' gradients are summed.

        Everything is checked before anything changes. Rows not yet present are created first
        (as a lookup would) and then updated; where the table admits ids (see `rows`), their
        gradients are dropped instead, counted in `counters.dropped_gradients`.

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
        ids, grads = sum_repeated(ids, grads.astype(self.dtype, copy=False))
        slots = self._ids.recall(ids)  # the ids of a pull: found then, not looked up again
        if slots is None and self.admission is None:
            slots = self._slots_of(ids)
        elif slots is None:  # rows come from lookups only: an id not admitted has none
            slots = self._ids.lookup(ids)
            kept = slots >= 0
            self.counters.dropped_gradients += int(len(ids) - np.count_nonzero(kept))
            slots, grads = slots[kept], grads[kept]
        values = np.take(self._values, slots, axis=0)
        slot_rows = {n: np.take(self._slots[n], slots, axis=0) for n in optimizer.slot_names}
        optimizer.apply(values, slot_rows, grads, step, lr_scale)
        self._step = max(self._step, int(step))
        self._recency.mark(slots, self._step)
        scatter(self._values, slots, values)
        for name, rows in slot_rows.items():
            scatter(self._slots[name], slots, rows)

    def export(self, chunk_rows=65536):
        """Yields `(ids, rows)` copies of every row, at most `chunk_rows` at a time, by slot.

        The table must not change while the iterator is in use.
        """
        ids, slots = self._ids.items()
        for start in range(0, len(ids), chunk_rows):
            chunk = slots[start:start + chunk_rows]
            yield ids[start:start + chunk_rows], np.take(self._values, chunk, axis=0)

    def state(self):
        """A `TableState` copy of every row, slot and row's last use, for checkpoints."""
        ids, slots = self._ids.items()
        return TableState(
            ids=ids,
            values=np.take(self._values, slots, axis=0),
            slots={name: np.take(array, slots, axis=0) for name, array in self._slots.items()},
            touched=self._recency.of(slots),
        )

    def evict(self, max_rows=None, idle_steps=None, keep=()):
        """Removes the rows not used in training in the last `idle_steps` update steps,
        then, while more than `max_rows` remain, the least recently used ones, never the
        rows of the slots `keep`. Returns the ids removed (counted in `counters.evicted`)."""
        ids, slots, entries = self._ids.entries()
        age = self._recency.ages(slots, self._step)
        drop = age > idle_steps if idle_steps else np.zeros(len(ids), dtype=bool)
        extra = len(ids) - int(np.count_nonzero(drop)) - (max_rows or 0)
        if max_rows is not None and extra > 0:
            age[drop] = 0
            if np.count_nonzero(age) >= extra:  # older rows suffice: `keep` was used now
                drop[np.argpartition(age, len(age) - extra)[len(age) - extra:]] = True
            else:  # rows used at this step go too, but not those of `keep`
                kept = np.zeros(self._ids.slot_bound, dtype=bool)
                kept[np.asarray(keep, dtype=np.int64)] = True
                candidates = np.flatnonzero(~drop & ~kept[slots])
                extra = min(extra, len(candidates))
                oldest = np.argsort(age[candidates], kind="stable")[len(candidates) - extra:]
                drop[candidates[oldest]] = True
        self._ids.remove_entries(entries[drop])
        self.counters.evicted += int(np.count_nonzero(drop))
        gone = ids[drop]
        del ids, slots, entries, age, drop
        release_free_memory()
        return gone

    def advance(self, step):
        """Moves the table to the shard's update `step` (every update, whatever it touched)."""
        self._step = max(self._step, int(step))

    def touched(self):
        """Each row's last step used in training, in no particular order."""
        return self._recency.of(self._ids.entries()[1])

    def remove(self, ids):
        """Removes the rows of `ids` (absent ones skipped) and slots; returns how many."""
        return int(np.count_nonzero(self._ids.remove(self._check_ids(ids)) >= 0))

    @classmethod
    def from_state(cls, name, initializer, ids, values, slots=None, input_dim=0,
                   slot_initial_values=None, touched=None, step=0, lifecycle=Lifecycle()):
        """A table holding `ids` with rows `values` and slot rows `slots` (`{name: array}`),
        each row last used at the update step `touched` (None: all at `step`, the latest
        update step applied).

        `dim` and `dtype` come from `values`; the slot names from `slots`. The arrays are
        copied (or cast) into the table's own.

        Raises:
            DataError: the arrays disagree in shape, ids repeat or lie outside `input_dim`, or
            `touched` lies outside `[0, step]`.
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
                    slot_initial_values, lifecycle)
        try:
            table._check_ids(ids)
        except PayloadError as exc:
            raise DataError(f"{what}: {exc}") from exc
        table._ids = IdMap(len(ids), most=lifecycle.max_rows)
        table._ids.insert(ids)  # distinct ids get the slots 0, 1, 2, ... in order
        if len(table._ids) != len(ids):
            raise DataError(f"{what}: ids must be distinct. Received: {len(ids)} ids, "
                            f"{len(table._ids)} distinct")
        table._values = np.array(values, dtype=table.dtype, order="C")
        table._step = int(step)
        table._recency = Recency(touched, table._step, len(ids))
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
        """The slot of each id (1-D), creating the rows of absent ids that are admitted
        (-1 for the others). A lookup marks the rows it finds used now."""
        slots = self._ids.lookup(ids)
        absent = slots < 0
        self._recency.mark(slots[~absent], self._step)
        if not absent.any():
            self._ids.remember(ids, slots)
            return slots
        new_ids, positions = distinct(ids[absent])
        admitted = (np.ones(len(new_ids), dtype=bool) if self.admission is None
                    else self.admission.admit(new_ids))
        self.counters.not_admitted_lookups += int(np.count_nonzero(~admitted[positions]))
        new_ids = new_ids[admitted]
        self._make_room(len(new_ids), keep=slots[~absent])
        # May fail (memory) after admission and eviction, before rows and the map change.
        self._reserve(self._ids.slots_after_insert(len(new_ids)))
        new_slots = np.full(len(admitted), -1, dtype=np.int64)
        new_slots[admitted] = self._ids.insert(new_ids)
        slots[absent] = new_slots[positions]
        created = as_slice(new_slots[admitted])
        self._recency.mark(created, self._step)
        self._values[created] = initial_rows(
            self.name, new_ids, self.dim, self.initializer, self.input_dim, self.dtype)
        for name, array in self._slots.items():
            array[created] = self._slot_initial[name]
        self.counters.admitted += len(new_ids)
        if admitted.all():
            self._ids.remember(ids, slots)
        return slots

    def _make_room(self, count, keep):
        """Evicts rows, a batch at a time, so that `count` new rows fit the budget; never
        the rows of the slots `keep` (a budget below them is exceeded, not broken)."""
        budget = self.lifecycle.max_rows
        if not budget or len(self._ids) + count <= budget:
            return
        self.evict(max_rows=max(budget - count - budget // EVICTION_BATCH, 0), keep=keep)

    def _reserve(self, rows):
        """Makes room for `rows` rows, growing each array by at least `GROWTH`.

        Each array is checked on its own, so a call that ran out of memory halfway leaves a
        consistent table that the next call finishes growing.
        """
        if rows <= self.capacity and all(len(a) >= rows for a in (self._recency.steps,
                                                                 *self._slots.values())):
            return
        grown = max(int(self.capacity * GROWTH), _MIN_CAPACITY)
        if self.lifecycle.max_rows:  # a table with a budget never needs more
            grown = min(grown, self.lifecycle.max_rows)
        shape = (max(rows, grown), self.dim)
        for holder, key in ((self.__dict__, "_values"), (self._recency.__dict__, "steps"),
                            *((self._slots, name) for name in self.slot_names)):
            if len(holder[key]) < rows:
                grow(holder, key, shape[:holder[key].ndim])
        for array in (self._values, *self._slots.values()):
            advise_huge_pages(array)
        release_free_memory()  # what the arrays' copies left behind

