"""What keeps an embedding table in bounds: which new ids get a row, and which rows go.

A `Lifecycle` is a table's policy on one shard:

- **Admission.** With `admit_after=N`, an id gets a row only once it has been looked up in
  training N times; with `admit_probability=p`, each training lookup of an id without a row
  gives it one with probability p. Until then the id reads zeros (what a served export
  gives an id it never saw, and a row that adds nothing to a sum) and its gradients are
  dropped, counted. Sightings are counted in a count-min sketch (`SightingCounter`), a fixed
  block of small counters, never a dict: a few ids that share counters with frequent ones
  are admitted early. Admission takes an id's N sightings off its counters, so an evicted id
  that returns must be seen N times again; counters halve every `width * 2` sightings, so
  ids seen long ago fade.
- **Eviction.** With `idle_steps=T`, rows not looked up or updated in training for T update
  steps of the shard are removed (with `idle_seconds=S`, for S seconds: an `IdleClock` tells
  which update step was S seconds ago); with `max_rows=R`, a table about to hold more than R rows
  first removes the least recently used ones, an eighth of R at a time (so the cost of
  choosing them is spread over many new ids). Rows go with their optimizer slots.

`TableCounters` keeps what happened, for the job's summary and status page.

Example:

    >>> import numpy as np
    >>> admission = Admission.of(Lifecycle(admit_after=2), seed="user")
    >>> admission.admit(np.array([7, 8])).tolist()
    [False, False]
    >>> admission.admit(np.array([7])).tolist()
    [True]
"""

import collections
import dataclasses
import hashlib
import logging
import time

import numpy as np

from elastic_keras.common.embedding_lifecycle import EmbeddingLifecycle, check_lifecycle
from elastic_keras.common.errors import DataError
from elastic_keras.common.hashing import mix64

logger = logging.getLogger(__name__)

EVICTION_BATCH = 8  # a full table frees max_rows // EVICTION_BATCH rows at a time
_SKETCH_DEPTH = 4
_HALVING = 2  # counters halve every this many sightings per counter of a row
_COUNTER_MAX = np.iinfo(np.uint8).max


@dataclasses.dataclass(frozen=True)
class Lifecycle:
    """A table's admission and eviction policy on one shard (all off by default).

    Attributes:
        admit_after: sightings in training before an id gets a row; 0 or 1: at once.
        admit_probability: chance that a sighting of an id without a row gives it one.
        idle_steps: rows unused for more update steps than this are evicted; 0: never.
        max_rows: rows the table may hold on the shard; 0: no bound.
        idle_seconds: rows unused for this long are evicted; 0: never.
    """

    admit_after: int = 0
    admit_probability: float = 1.0
    idle_steps: int = 0
    max_rows: int = 0
    idle_seconds: float = 0.0

    def __post_init__(self):
        check_lifecycle(dataclasses.asdict(self))

    @property
    def admits_all(self):
        """Every id looked up gets a row at once."""
        return self.admit_after <= 1 and self.admit_probability >= 1.0

    def describe(self):
        """The policy in words, for logs."""
        parts = []
        if self.admit_after > 1:
            parts.append(f"rows after {self.admit_after} sightings")
        if self.admit_probability < 1.0:
            parts.append(f"rows with probability {self.admit_probability:g}")
        if self.idle_steps:
            parts.append(f"evicted after {self.idle_steps} idle steps")
        if self.idle_seconds:
            parts.append(f"evicted after {self.idle_seconds:g} idle seconds")
        if self.max_rows:
            parts.append(f"at most {self.max_rows} rows on this shard")
        return ", ".join(parts) or "every id kept"


@dataclasses.dataclass
class TableCounters:
    """What admission and eviction did to one table on one shard, since the shard started
    (restored counts included)."""

    admitted: int = 0            # rows created
    evicted: int = 0             # rows removed by eviction
    not_admitted_lookups: int = 0  # training lookups of ids without a row that got none
    dropped_gradients: int = 0   # gradient rows of ids without a row, not applied

    def as_dict(self):
        return dataclasses.asdict(self)


class Admission:
    """Decides which ids without a row get one (`admit`); see the module docstring. Its
    `state()` (sighting counts, or None) goes into checkpoints and comes back by `restore`."""

    @staticmethod
    def of(lifecycle, seed):
        """The admission of `lifecycle`, or None where every id is admitted."""
        if lifecycle.admits_all:
            return None
        if lifecycle.admit_after > 1:
            return _Counted(lifecycle.admit_after, SightingCounter(lifecycle.max_rows, seed))
        return _Drawn(lifecycle.admit_probability, seed)


class _Counted(Admission):
    def __init__(self, threshold, counter):
        self.threshold, self.counter = threshold, counter

    @property
    def nbytes(self):
        return self.counter.nbytes

    def state(self):
        """The sighting counts, for checkpoints."""
        return self.counter.counts.copy()

    def restore(self, counts):
        """Takes counts of a `state()` of the same shape (of a shard with the same budget);
        others are ignored (counting starts over). Returns whether it took them."""
        if np.shape(counts) != self.counter.counts.shape:
            return False
        self.counter.counts[...] = counts
        return True

    def admit(self, ids):
        """Counts one sighting of each of the distinct `ids`; True where an id is admitted."""
        admitted = self.counter.add(ids) >= self.threshold
        self.counter.take(ids[admitted], self.threshold)
        return admitted


class _Drawn(Admission):
    nbytes = 0

    def state(self):
        return None

    def restore(self, counts):
        return False

    def __init__(self, probability, seed):
        self.probability = probability
        self._random = np.random.default_rng(_seed_of(seed))

    def admit(self, ids):
        return self._random.random(len(ids)) < self.probability


class SightingCounter:
    """A count-min sketch of how often ids were seen: 4 rows of saturating 8-bit counters,
    2^20 to 2^22 a row (4 to 16 MiB); an id's count is the least of its counters, never
    below its true count until the counters halve (every 2 x width sightings).

    Args:
        expected: about how many distinct ids it must tell apart (its width grows with it).
        seed: what makes the hashes of one table differ from another's.
    """

    def __init__(self, expected, seed):
        self.width = 1 << max(20, min(int(max(expected, 1) * 2 - 1).bit_length(), 22))
        self.counts = np.zeros((_SKETCH_DEPTH, self.width), dtype=np.uint8)
        base = _seed_of(seed)
        self._salts = mix64(np.array([(base + i) % (1 << 64) for i in range(_SKETCH_DEPTH)],
                                     dtype=np.uint64))
        self._since_halving = 0

    def add(self, ids):
        """Adds one sighting of each distinct id; returns each id's count after it.

        A conservative update: only the counters at the id's least count rise, so ids that
        share counters with busy ones are overcounted less (on a stream of new ids, about
        0.2% were admitted at their first sighting with `admit_after=3`, against 20% with
        every counter rising)."""
        columns = self._columns(ids)
        rows = np.arange(_SKETCH_DEPTH)[:, None]
        counts = self.counts[rows, columns].astype(np.int64)
        least = counts.min(axis=0) + 1
        self.counts[rows, columns] = np.minimum(np.maximum(counts, least), _COUNTER_MAX)
        self._since_halving += len(ids)
        if self._since_halving >= self.width * _HALVING:
            self.counts >>= 1
            self._since_halving = 0
        return np.minimum(least, _COUNTER_MAX)

    def take(self, ids, amount):
        """Takes `amount` sightings off each id's counters (not below zero)."""
        if not len(ids):
            return
        columns = self._columns(ids)
        rows = np.arange(_SKETCH_DEPTH)[:, None]
        counts = self.counts[rows, columns].astype(np.int64)
        self.counts[rows, columns] = np.maximum(counts - amount, 0)

    @property
    def nbytes(self):
        return self.counts.nbytes

    def _columns(self, ids):
        hashed = mix64(np.asarray(ids, dtype=np.int64).view(np.uint64)[None, :]
                       ^ self._salts[:, None])
        return (hashed & np.uint64(self.width - 1)).astype(np.intp)


def _seed_of(text):
    return int.from_bytes(hashlib.blake2b(str(text).encode(), digest_size=8).digest(), "little")


@dataclasses.dataclass(frozen=True)
class ShardLifecycle:
    """What a shard's flags say of its tables' lifecycles: the job's defaults
    (`EmbeddingLifecycle`) for the settings a table's layer leaves unset, and the number of
    shards a table's row budget is split over."""

    defaults: EmbeddingLifecycle = EmbeddingLifecycle()
    num_ps: int = 1

    @property
    def max_rows_per_shard(self):
        return self.defaults.ps_max_rows_per_shard

    def of_table(self, table):
        """The `Lifecycle` of the `TableConfig` `table` on this shard.

        Raises:
            ValueError: the table's own settings break a rule of `Lifecycle`.
        """
        d = self.defaults
        if table.admit_after is None and table.admit_probability is None:
            admit_after, probability = d.embedding_admit_after, d.embedding_admit_probability
        else:  # the layer's admission replaces the job's whole
            admit_after = table.admit_after or 0
            probability = 1.0 if table.admit_probability is None else table.admit_probability
        max_rows = d.embedding_max_rows if table.max_rows is None else table.max_rows
        check_lifecycle({"max_rows": max_rows})  # before it is split over the shards
        return Lifecycle(
            admit_after=admit_after, admit_probability=probability,
            idle_steps=d.embedding_idle_steps if table.idle_steps is None else table.idle_steps,
            max_rows=-(-max_rows // self.num_ps),  # this shard's share, rounded up
            idle_seconds=(d.embedding_idle_seconds if table.idle_seconds is None
                          else table.idle_seconds),
        )


def upkeep(tables, clocks, step, max_rows_per_shard=0):
    """After the update `step` (None: not after an update, e.g. a pull), evicts the idle rows
    of `tables` (`{name: EmbeddingTable}`): each table every eighth of its `idle_steps` (so a
    row goes between T and 9T/8 idle steps) and every sixteenth of its `idle_seconds` (by its
    `IdleClock` in `clocks`); then rows over the shard's budget of `max_rows_per_shard` over
    all tables (0: none). Returns how many rows went. Running out of memory here is logged,
    not raised: the update or pull it follows has happened."""
    gone = 0
    try:
        for name, table in tables.items() if step is not None else ():
            idle, clock = table.lifecycle.idle_steps, clocks.get(name)
            if idle and step % max(1, idle // 8) == 0:
                gone += len(table.evict(idle_steps=idle))
            if clock is not None and clock.tick(step):
                steps = clock.idle_steps(step)
                gone += len(table.evict(idle_steps=steps)) if steps is not None else 0
        return gone + evict_over_budget(list(tables.values()), max_rows_per_shard)
    except MemoryError:
        logger.exception("Evicting embedding rows ran out of memory; the tables keep their "
                         "rows until the next try")
        return gone


def evict_over_budget(tables, max_rows):
    """Evicts the least recently used rows of any of `tables` (`EmbeddingTable`s) until
    they hold at most `max_rows` rows together. Returns how many went."""
    held = sum(t.num_rows for t in tables)
    if not max_rows or held <= max_rows:
        return 0
    extra = held - max(max_rows - max_rows // EVICTION_BATCH, 0)
    touched = [t.touched() for t in tables]
    every = np.concatenate(touched)
    cutoff = np.partition(every, extra - 1)[extra - 1]  # the newest step that goes
    quota = extra - int(np.count_nonzero(every < cutoff))  # rows used at `cutoff` that go
    gone = 0
    for table, steps in zip(tables, touched):
        older = int(np.count_nonzero(steps < cutoff))
        at_cutoff = min(int(np.count_nonzero(steps == cutoff)), quota)
        quota -= at_cutoff
        if older + at_cutoff:
            gone += len(table.evict(max_rows=table.num_rows - older - at_cutoff))
    return gone


class Recency:
    """Per row slot, the update step its row was last used at, in 4 bytes: steps are kept
    relative to a base that moves up as the shard's step grows, so a table may live for
    any number of steps (rows not used for 2^30 steps then read as used at the base)."""

    _MOST = 1 << 31  # the largest step above the base a slot holds

    def __init__(self, steps=None, step=0, count=0):
        """`steps`: each of `count` slots' step (absolute), None: all at `step`, the latest.

        Raises:
            DataError: `steps` is not `count` steps from 0 to `step`.
        """
        steps = np.full(count, step, np.int64) if steps is None else np.asarray(steps)
        if steps.shape != (count,) or (count and (steps.min() < 0 or steps.max() > step)):
            raise DataError(f"The rows' last uses must be {count} steps from 0 to {step}. "
                             f"Received: shape {list(steps.shape)}, from "
                             f"{steps.min() if steps.size else None} to "
                             f"{steps.max() if steps.size else None}")
        steps = steps.astype(np.int64)
        self.base = max(int(steps.min()) if len(steps) else step, step - self._MOST, 0)
        self.steps = (np.maximum(steps - self.base, 0)).astype(np.uint32)

    def mark(self, slots, step):
        """Records that the rows of `slots` were used at `step`."""
        if step - self.base > self._MOST:
            shift = step - self.base - self._MOST // 2
            self.steps = (np.maximum(self.steps.astype(np.int64), shift) - shift).astype(
                np.uint32)
            self.base += shift
        self.steps[slots] = step - self.base

    def of(self, slots):
        """The step each of `slots` was last used at (int64)."""
        return self.steps[slots].astype(np.int64) + self.base

    def ages(self, slots, step):
        """How many steps before `step` each of `slots` was last used (uint32; `step` is at
        least every step marked)."""
        return np.uint32(step - self.base) - self.steps[slots]


class IdleClock:
    """Which update step of a shard was `seconds` ago, to within a sixteenth of it: the
    shard tells it each update (`tick`), and it keeps a sample every sixteenth of `seconds`
    over the last two `seconds` (at most 33 samples).

    Steps from before the clock started (a restored shard's) count as used when it started.
    """

    def __init__(self, seconds, clock=None):
        self.seconds, self._clock = float(seconds), clock or time.monotonic
        self._samples = collections.deque()  # (time, the latest step then), oldest first

    def tick(self, step):
        """Records that the shard has applied `step`; returns whether a sixteenth of
        `seconds` passed since the last sample (time to look for idle rows)."""
        now = self._clock()
        if self._samples and now - self._samples[-1][0] < self.seconds / 16:
            return False
        self._samples.append((now, step))
        while len(self._samples) > 2 and self._samples[1][0] < now - 2 * self.seconds:
            self._samples.popleft()
        return True

    def idle_steps(self, step):
        """At the update `step`: rows last used more than this many steps ago were last used
        at least `seconds` ago (None: no step is that old yet)."""
        before = [s for t, s in self._samples if t <= self._clock() - self.seconds]
        return step - before[-1] - 1 if before else None
