"""A training step's embedding-row pulls, one call per shard for tables that share ids.

Each PS-backed layer asks for its rows on its own, while the step runs (see
`layers.lookup_context`). Models often look up several tables with the same ids (DeepFM's
first-order weights and factors, a wide and a deep table of one feature): asked one by one,
each table costs a round trip to every shard and the Python of a call on both ends.
`RowPulls` learns, from each step, which tables were looked up with equal ids; in the next
step the first of them to be looked up pulls them all in one call per shard, and the others
take their rows from that answer if their ids are equal again, which is checked (otherwise
they are pulled on their own).

Where the next step's ids are known ahead (`ahead`, while this step computes), its rows are
pulled then, in the background, in one call per shard for every table; each lookup of the
next step takes its rows from that answer if its ids are the ones announced (otherwise, or if
that pull failed, it pulls as above). Rows are only ever used in the step they were pulled
for.

Example:

    >>> pulls = RowPulls(client.pull_embeddings)  # doctest: +SKIP
    >>> pulls.rows("fm_linear", ids); pulls.rows("fm_factors", ids)  # doctest: +SKIP
    >>> pulls.end_step()  # the next step pulls both tables in one call  # doctest: +SKIP
    >>> pulls.ahead([("fm_linear", next_ids), ("fm_factors", next_ids)])  # doctest: +SKIP
"""

import concurrent.futures
import logging
import threading

import numpy as np
import tensorflow as tf

from elastic_keras.layers.lookup_context import LookupContext, LookupRecord, lookup_context
from elastic_keras.worker.steps import compile_step

logger = logging.getLogger(__name__)


class RowPulls:
    """Serves one step's row lookups through `pull`, grouping tables that share ids.

    A lookup is known by its table and how many lookups of that table came before it in
    the step (a model's lookups come in the same order at every step).

    Args:
        pull: `pull({table: unique int64 ids}) -> {table: rows}`, one call to every shard.
        pull_ahead: the same, for pulls ahead of their step (in the background: it should
            not wait through outages, a lookup pulls again if it failed). None: `pull`.
    """

    def __init__(self, pull, pull_ahead=None):
        self._pull = pull
        self._pull_ahead = pull_ahead or pull
        self._lock = threading.Lock()  # lookups may run on TensorFlow's threads
        self._partners = {}  # lookup -> lookups of other tables with equal ids last step
        self._ready = {}     # lookup -> (ids, rows) pulled this step with a partner
        self._seen = []      # (lookup, ids) of this step, in order
        self._ahead = {}     # lookup -> (ids, future of {table: rows}), pulled for this step
        self._coming = {}    # the same, pulled for the next step
        self._background = None  # the thread pulling ahead, started on first use

    def rows(self, table, ids):
        """The rows of `table` for `ids` (a 1-D int64 array of distinct ids)."""
        with self._lock:
            lookup = (table, sum(1 for (t, _), _ in self._seen if t == table))
            self._seen.append((lookup, ids))
            pulled = _answer(self._ahead.pop(lookup, None), ids, table)
            if pulled is not None:
                return pulled
            ready = self._ready.pop(lookup, None)
            if ready is not None and np.array_equal(ready[0], ids):
                return ready[1]
            done = {seen for seen, _ in self._seen}
            partners = [p for p in self._partners.get(lookup, ())
                        if p not in self._ready and p not in done]
            pulled = self._pull({table: ids, **{t: ids for t, _ in partners}})
            for partner in partners:
                self._ready[partner] = (ids, pulled[partner[0]])
            return pulled[table]

    def end_step(self):
        """Ends a step (whether it ran to the end or not): rows pulled for a partner that
        was not looked up are dropped, and the lookups of other tables with equal ids in
        this step become partners for the next."""
        with self._lock:
            self._partners = {}
            for lookup, ids in self._seen:
                partners = [other for other, other_ids in self._seen
                            if other[0] != lookup[0] and other_ids.size == ids.size
                            and np.array_equal(other_ids, ids)]
                if partners:
                    self._partners[lookup] = partners
            self._ready.clear()
            self._seen = []
            self._ahead, self._coming = self._coming, {}

    def ahead(self, lookups):
        """Starts pulling, in the background, the rows of the next step's `lookups`:
        `(table, unique int64 ids)` in the order the step will look them up. A table's
        later lookups with other ids are left to the step."""
        keys, first = [], {}
        for table, ids in lookups:
            keys.append(((table, sum(1 for (t, _), _ in keys if t == table)), ids))
            first.setdefault(table, ids)
        with self._lock:
            if self._background is None:
                self._background = concurrent.futures.ThreadPoolExecutor(1, "rows-ahead")
            future = self._background.submit(self._pull_ahead, first)
            self._coming = {lookup: (ids, future) for lookup, ids in keys
                            if ids is first[lookup[0]]}


def _answer(ahead, ids, table):
    """The rows of `table` a pull ahead brought for `ids`, or None: it was for other ids,
    or failed (the lookup pulls on its own)."""
    if ahead is None or not np.array_equal(ahead[0], ids):
        return None
    try:
        return ahead[1].result()[table]
    except Exception as exc:  # the step's own pull says what is wrong, if it still is
        logger.debug("Pulling the rows of %r ahead failed: %s", table, exc)
        return None


class IdsOnly(LookupContext):
    """A `LookupContext` that records what a model looks up and serves zero rows: traced
    with it, a model's call gives the ids of each of its lookups without pulling a row."""

    def __init__(self):
        super().__init__(lambda table, ids: None)

    def lookup(self, table, unique_ids, dim, dtype):
        rows = tf.zeros([tf.shape(unique_ids)[0], dim], dtype)
        self.records.append(LookupRecord(table, unique_ids, rows))
        return rows


def looked_up_ids(model):
    """`ids(features) -> [(table, unique int64 ids)]`: what `model` looks up for `features`,
    lookup by lookup in order, from the model's call compiled for its ids alone (its
    inference call, with zero rows)."""
    tables = []

    def ids_fn(features):
        context = IdsOnly()
        with lookup_context(context):
            model(features, training=False)
        tables[:] = [r.table for r in context.records]  # at trace time: static
        return [r.unique_ids for r in context.records]

    compiled = compile_step(ids_fn, "look-ahead of embedding ids")
    return lambda features: list(zip(tables, (np.asarray(i) for i in compiled(features))))
