"""A training step's embedding-row pulls, one call per shard for tables that share ids.

Each PS-backed layer asks for its rows on its own, while the step runs (see
`layers.lookup_context`). Models often look up several tables with the same ids (DeepFM's
first-order weights and factors, a wide and a deep table of one feature): asked one by one,
each table costs a round trip to every shard and the Python of a call on both ends.
`RowPulls` learns, from each step, which tables were looked up with equal ids; in the next
step the first of them to be looked up pulls them all in one call per shard, and the others
take their rows from that answer if their ids are equal again, which is checked (otherwise
they are pulled on their own). Rows are only ever used in the step that pulled them.

Example:

    >>> pulls = RowPulls(lambda ids_by_table: client.pull_embeddings(ids_by_table))  # doctest: +SKIP
    >>> pulls.rows("fm_linear", ids); pulls.rows("fm_factors", ids)  # doctest: +SKIP
    >>> pulls.end_step()  # the next step pulls both tables in one call  # doctest: +SKIP
"""

import threading

import numpy as np


class RowPulls:
    """Serves one step's row lookups through `pull`, grouping tables that share ids.

    A lookup is known by its table and how many lookups of that table came before it in
    the step (a model's lookups come in the same order at every step).

    Args:
        pull: `pull({table: unique int64 ids}) -> {table: rows}`, one call to every shard.
    """

    def __init__(self, pull):
        self._pull = pull
        self._lock = threading.Lock()  # lookups may run on TensorFlow's threads
        self._partners = {}  # lookup -> lookups of other tables with equal ids last step
        self._ready = {}     # lookup -> (ids, rows) pulled this step with a partner
        self._seen = []      # (lookup, ids) of this step, in order

    def rows(self, table, ids):
        """The rows of `table` for `ids` (a 1-D int64 array of distinct ids)."""
        with self._lock:
            lookup = (table, sum(1 for (t, _), _ in self._seen if t == table))
            self._seen.append((lookup, ids))
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
