"""A hash map from int64 ids to dense row slots, held in one numpy array.

An embedding table keeps its rows in one contiguous array; `IdMap` says which row (slot)
holds each id. Slots are handed out as 0, 1, 2, ... in the order ids are first inserted, so
the table's arrays stay dense; the slots of removed ids are handed out again first (the
lowest first), so a table that removes rows as fast as it adds them keeps its size.

There is no Python object per entry: the map is an open-addressing table of entries, each
an int64 key beside its int64 slot (16 bytes, so a probe reads one cache line, not one in a
keys array and another in a slots array). Its capacity is any number of entries, so a map is
sized to what it holds: an id's first entry is a 64-bit mix of the id scaled to the
capacity, and its probes follow the triangular sequence home, home+1, home+3, home+6, ...
over the next power of two (which visits every position); positions past the last entry
wrap to the first entries, so every position read is an entry and no memory is spent on
positions past the capacity. A slot of -1 marks an empty entry, so every int64 value, 0 and
-1 included, is a valid id. A removed id's entry is marked removed: lookups probe on past
it, an insertion takes the first such entry on its way (once it knows the id is absent),
and a rehash drops those left (they count toward the load until then).

The map grows to twice what it holds when entries and removed ones pass `MAX_LOAD`, never
past room for `most` ids where the caller knows its bound (a table with a row budget), and
is rebuilt at its size when removed entries fill it: at its bound an id costs
16 / `SIZED_LOAD` (about 27) bytes.

A map also remembers the slots of its last `RECALLED` batches of ids found whole, up to
`RECALLED_IDS` ids in all (`remember`), until an id is removed: a training step's push
carries the very ids its pull looked up, and `recall` gives their slots back after one
comparison instead of a lookup.

Every operation works on whole batches of ids at once: each round of probing is a handful of
vectorised gathers over the ids still unresolved, and a lookup's later rounds read several
positions of each id's sequence at once, so a long probe costs a few rounds. Insertion
resolves collisions inside a batch by letting ids claim empty entries together and reading
back which claim won.

Example:

    >>> import numpy as np
    >>> ids = IdMap()
    >>> ids.insert(np.array([42, -7, 42, 0])).tolist()
    [0, 1, 0, 2]
    >>> ids.lookup(np.array([0, 5, 42])).tolist()
    [2, -1, 0]
    >>> ids.remove(np.array([-7, 5])).tolist()
    [1, -1]
    >>> ids.insert(np.array([8])).tolist()  # the slot -7 had
    [1]
    >>> len(ids), [a.tolist() for a in ids.items()]
    (3, [[42, 8, 0], [0, 1, 2]])
"""

import collections

import numpy as np

from elastic_keras.common.hashing import mix64
from elastic_keras.ps.row_arrays import release_free_memory

MAX_LOAD = 0.75  # the most entries (held and removed) a map has before it grows or rebuilds
SIZED_LOAD = 0.6  # how full a map is made when it is (re)built for a number of ids
RECALLED = 16  # batches of ids whose slots a map remembers (see `remember`)
RECALLED_IDS = 1 << 20  # ids those batches hold at most together (16 MB with their slots)
WINDOW = 8  # probe positions an unresolved id reads in a round, at most (see `_probe`)
_MIN_CAPACITY = 16
_EMPTY = -1
_REMOVED = np.iinfo(np.int64).min  # the slot of a removed id's entry until the next rehash
# Position j of a window that starts at probe step s is j steps on: j * s + j * (j + 1) / 2
# past its first position. These are the second terms; the first is `s * _STEPS`.
_STEPS = np.arange(WINDOW)
_OFFSETS = np.cumsum(_STEPS)
# Salts the hash so the entries of one shard do not inherit the partition's choice of shard.
_SALT = np.uint64(0x6A09E667F3BCC909)


class IdMap:
    """Maps int64 ids to consecutive slots 0, 1, 2, ...; see the module docstring.

    Not thread-safe: the caller serialises calls.

    Args:
        expected: how many ids to make room for at once (growth happens anyway).
        most: how many ids the map holds at most (0: no bound): it grows past room for them
            only while it holds more.
    """

    def __init__(self, expected=0, most=0):
        self._size = 0        # ids in the map
        self._removed = 0     # entries of removed ids (tombstones) until the next rehash
        self._next_slot = 0   # slots handed out so far: every slot is below it
        self._most = int(most)
        self._free = np.empty(0, dtype=np.int64)  # slots of removed ids, reused first
        self._recalled = collections.OrderedDict()  # (len, first, last) -> (ids, slots)
        self._allocate(_capacity_for(expected))

    def __len__(self):
        return self._size

    @property
    def slot_bound(self):
        """Every slot in use is below this (slots of removed ids are reused first)."""
        return self._next_slot

    def slots_after_insert(self, count):
        """`slot_bound` once `count` absent ids are inserted: where a table's arrays must
        reach before it inserts them."""
        return self._next_slot + max(0, count - len(self._free))

    @property
    def capacity(self):
        """The number of entries of the hash table."""
        return self._capacity

    @property
    def nbytes(self):
        """Bytes held by the map's array."""
        return self._entries.nbytes

    def lookup(self, ids):
        """The slot of each id, -1 where the id is absent: an int64 array shaped like `ids`."""
        ids = _as_ids(ids)
        return self._probe(ids.reshape(-1), stops=False)[0].reshape(ids.shape)

    def insert(self, ids):
        """The slot of each id, adding absent ids with new slots in order of first appearance.

        Repeated ids in `ids` get one slot. Returns an int64 array shaped like `ids`.
        """
        ids = _as_ids(ids)
        slots, position, step = self._probe(ids.reshape(-1), stops=True)
        missing = np.flatnonzero(slots < 0)
        if len(missing):
            new_ids, first, inverse = _first_appearance(ids.reshape(-1)[missing])
            if self._reserve(self._size + len(new_ids)):
                position, step = self._home(new_ids), np.zeros(len(new_ids), dtype=np.intp)
            else:  # carry on probing from the empty entry the lookup stopped at
                position, step = position[missing[first]], step[missing[first]]
            new_slots = self._new_slots(len(new_ids))
            self._place(new_ids, new_slots, position, step)
            self._size += len(new_ids)
            slots[missing] = new_slots[inverse]
        return slots.reshape(ids.shape)

    def remove(self, ids):
        """Removes `ids` from the map; their slots go to later insertions. Returns the slot
        each id had, -1 where it was absent (an int64 array shaped like `ids`)."""
        ids = _as_ids(ids)
        flat = ids.reshape(-1)
        distinct = np.unique(flat)
        slots, _, _ = self._probe(distinct, stops=False)
        present = slots >= 0
        gone, freed = distinct[present], slots[present]
        if len(gone):
            position = self._probe_entries(gone)
            self._entries[position, 1] = _REMOVED  # probes go on past it; inserts reuse it
            self._free_slots(freed)
        return slots[np.searchsorted(distinct, flat)].reshape(ids.shape)

    def remember(self, ids, slots):
        """Keeps the `slots` of 1-D `ids`, every one in the map, for `recall`; the map keeps
        the last `RECALLED` batches, of `RECALLED_IDS` ids at most, until an id is removed."""
        if not 0 < len(ids) <= RECALLED_IDS:
            return
        key = (len(ids), int(ids[0]), int(ids[-1]))
        self._recalled[key] = (np.array(ids, dtype=np.int64), np.array(slots))
        self._recalled.move_to_end(key)
        while len(self._recalled) > RECALLED or sum(
                len(kept) for kept, _ in self._recalled.values()) > RECALLED_IDS:
            self._recalled.popitem(last=False)

    def recall(self, ids):
        """The slots of 1-D `ids` if `remember` kept them for these ids, in this order (no id
        was removed since, so they are still what a lookup answers), else None."""
        kept = self._recalled.get((len(ids), int(ids[0]), int(ids[-1]))) if len(ids) else None
        if kept is None or not np.array_equal(kept[0], ids):
            return None
        return kept[1]

    def items(self):
        """(ids, slots) of every id in the map, ordered by slot."""
        ids, slots, _ = self.entries()
        order = np.argsort(slots, kind="stable")
        return ids[order], slots[order]

    def entries(self):
        """(ids, slots, entry positions) of every id in the map, in the map's order."""
        occupied = np.flatnonzero(self._entries[:, 1] >= 0)
        return self._entries[occupied, 0], self._entries[occupied, 1], occupied

    def remove_entries(self, positions):
        """Removes the ids at entry `positions` (from `entries`, the map unchanged since);
        their slots go to later insertions, as `remove`'s do."""
        self._free_slots(self._entries[positions, 1])
        self._entries[positions, 1] = _REMOVED

    def _free_slots(self, freed):
        """Hands the slots of `freed` (of as many ids just removed) to later insertions."""
        if len(freed):
            self._recalled.clear()  # a freed slot may be handed to another id
        self._free = np.sort(np.concatenate([self._free, freed]))[::-1]  # lowest last
        self._size -= len(freed)
        self._removed += len(freed)

    def _new_slots(self, count):
        """`count` slots for new ids: freed ones first (the lowest first), then new ones."""
        reused = min(count, len(self._free))
        taken = self._free[len(self._free) - reused:][::-1]
        self._free = self._free[:len(self._free) - reused]
        fresh = np.arange(self._next_slot, self._next_slot + count - reused, dtype=np.int64)
        self._next_slot += count - reused
        return np.concatenate([taken, fresh])

    def _allocate(self, capacity):
        # `full`, not `zeros`: numpy backs large arrays it fills itself with huge pages (not
        # those it gets zeroed by calloc), which speeds up a lookup's random reads.
        self._entries = np.full((capacity, 2), _EMPTY, dtype=np.int64)  # [key, slot]
        # The same bytes as one 16-byte element per entry, for `np.take` of whole entries.
        self._pairs = self._entries.view(np.complex128).reshape(-1)
        self._capacity = capacity
        self._mask = (1 << (capacity - 1).bit_length()) - 1

    def _home(self, ids):
        """The first entry each id probes: the top 32 bits of a 64-bit mix of the id, scaled
        to the capacity."""
        mixed = ids.view(np.uint64) ^ _SALT
        mix64(mixed, out=mixed)
        mixed >>= np.uint64(32)
        mixed *= np.uint64(self._capacity)
        return (mixed >> np.uint64(32)).astype(np.intp)

    def _probe(self, ids, stops):
        """Looks up 1-D `ids`: their slots (-1 if absent) and, with `stops`, for absent ids the
        first position on their way that an insertion may take (an empty entry, or a removed
        id's) and the probe step there (where an insertion carries on).

        The first round reads each id's first position (most ids resolve there), the second
        an unresolved id's next 4, and a later one its next `WINDOW`: a long probe costs a
        few rounds, each a handful of numpy calls, rather than one per position (and a short
        one few reads it does not need).
        """
        position = self._home(ids)  # the first round: one position (an entry), 1-D arrays
        entries = self._entries_at(position)
        slots = entries[:, 1]
        ended = (slots == _EMPTY) | ((slots >= 0) & (entries[:, 0] == ids))
        found = np.where(ended, slots, _EMPTY)  # the slot found, or -1 (empty)
        stop = np.full(len(ids) if stops else 0, -1, dtype=np.intp)
        stop_step = np.zeros_like(stop)
        if stops:
            np.copyto(stop, position, where=(slots == _EMPTY) | (slots == _REMOVED))
        pending = np.flatnonzero(~ended)
        keys, step, width = ids[pending], 1, 4
        position = (position[pending] + 1) & self._mask
        while len(pending):
            offsets = _OFFSETS[:width] + step * _STEPS[:width]
            window = (position[:, None] + offsets) & self._mask
            entries = self._entries_at(self._fold(window))  # [ids, width, 2]
            slots = entries[..., 1]
            ends = (slots == _EMPTY) | ((slots >= 0) & (entries[..., 0] == keys[:, None]))
            end = ends.argmax(axis=1)
            rows = np.arange(len(pending))
            ended = ends[rows, end]
            done = np.flatnonzero(ended)
            found[pending[done]] = slots[done, end[done]]
            if stops:
                free = (slots == _EMPTY) | (slots == _REMOVED)
                first = free.argmax(axis=1)
                new = np.flatnonzero(free[rows, first] & (stop[pending] < 0))
                stop[pending[new]] = window[new, first[new]]
                stop_step[pending[new]] = step + first[new]
            go_on = np.flatnonzero(~ended)
            pending, keys = pending[go_on], keys[go_on]
            step += width
            width = WINDOW
            position = (window[go_on, -1] + step) & self._mask
        return found, stop, stop_step

    def _probe_entries(self, ids):
        """The entry of each of `ids`, every one of which is in the map."""
        at = np.empty(len(ids), dtype=np.intp)
        pending, position, step = np.arange(len(ids)), self._home(ids), 0
        while len(pending):
            entry = self._fold(position)
            pairs = self._entries_at(entry)
            hit = (pairs[:, 1] >= 0) & (pairs[:, 0] == ids[pending])
            at[pending[hit]] = entry[hit]
            go_on = np.flatnonzero(~hit)
            step += 1
            pending = pending[go_on]
            position = (position[go_on] + step) & self._mask
        return at

    def _fold(self, position):
        """The entry at each probe position: positions past the last entry wrap to the first
        entries (which are then on every sequence twice)."""
        return np.where(position < self._capacity, position, position - self._capacity)

    def _entries_at(self, entry):
        """`[key, slot]` of the entries at the indices `entry` (a copy; `take` beats
        indexing)."""
        return np.take(self._pairs, entry).view(np.int64).reshape(*entry.shape, 2)

    def _place(self, keys, slots, position, step):
        """Stores distinct, absent `keys` with their `slots`, probing from `position`/`step`.

        An entry is taken if empty or a removed id's (which it then no longer is). Keys that
        reach the same such entry in one round all claim it by writing a marker (-2 - their
        index); the one whose marker is read back wins, the others probe on.
        """
        markers = -2 - np.arange(len(keys), dtype=np.int64)
        pending = np.arange(len(keys))
        while len(pending):
            entry = self._fold(position)
            was = self._entries_at(entry)[:, 1]
            empty = np.flatnonzero((was == _EMPTY) | (was == _REMOVED))
            placed = np.zeros(len(pending), dtype=bool)
            if len(empty):
                claimed, claimants = entry[empty], markers[pending[empty]]
                self._entries[claimed, 1] = claimants  # several may write one entry: one wins
                won = empty[self._entries[claimed, 1] == claimants]
                self._removed -= int(np.count_nonzero(was[won] == _REMOVED))
                self._entries[entry[won], 0] = keys[pending[won]]
                self._entries[entry[won], 1] = slots[pending[won]]
                placed[won] = True
            go_on = np.flatnonzero(~placed)
            pending, step = pending[go_on], step[go_on] + 1
            position = (position[go_on] + step) & self._mask

    def _reserve(self, size):
        """Makes room for `size` ids, with the entries of removed ids, within `MAX_LOAD`:
        rebuilds the map (which drops those entries), at twice `size` (at most room for
        `most`, unless `size` is past it) where the map is too small for that. Returns
        whether it rebuilt."""
        if size + self._removed <= self.capacity * MAX_LOAD:
            return False
        wanted = 2 * size if not self._most or size > self._most else min(2 * size, self._most)
        occupied = np.flatnonzero(self._entries[:, 1] >= 0)
        keys, slots = self._entries[occupied, 0], self._entries[occupied, 1]
        del occupied
        self._allocate(max(_capacity_for(wanted), self.capacity))
        self._removed = 0
        self._place(keys, slots, self._home(keys), np.zeros(len(keys), dtype=np.intp))
        del keys, slots
        release_free_memory()  # the old entries, and these copies: free heap otherwise kept
        return True


def _first_appearance(ids):
    """The distinct ids in order of first appearance, the index of each one's first
    appearance, and each id's index among the distinct ones."""
    ordered = np.sort(ids)  # a fast check: ids usually arrive distinct
    if not np.any(ordered[1:] == ordered[:-1]):
        every = np.arange(len(ids))
        return ids, every, every
    distinct, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    order = np.argsort(first)
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return distinct[order], first[order], rank[inverse]


def _as_ids(ids):
    ids = np.asarray(ids)
    if ids.dtype != np.int64:
        if ids.size and not np.issubdtype(ids.dtype, np.integer):
            raise TypeError(f"ids must be integers. Received: dtype={ids.dtype}")
        ids = ids.astype(np.int64)
    return ids


def _capacity_for(size):
    """Entries for `size` ids at `SIZED_LOAD`."""
    return max(_MIN_CAPACITY, int(np.ceil(size / SIZED_LOAD)))
