"""Fixtures for the layer tests: an in-memory row server standing in for the PS."""

import threading

import numpy as np
import pytest


class RowStore:
    """A `lookup_fn` over in-memory tables: rows set by the test, or created on first lookup.

    A created row is a deterministic function of (seed, table, id), like the PS's lazy rows.
    Every call is recorded as `(table, ids)`.
    """

    def __init__(self, dim, seed=0):
        self.dim = dim
        self.seed = seed
        self.tables = {}
        self.calls = []
        self._lock = threading.Lock()

    def set_rows(self, table, ids, rows):
        rows = np.asarray(rows, np.float32)
        for i, row in zip(np.asarray(ids, np.int64).tolist(), rows):
            self.tables.setdefault(table, {})[i] = row.copy()

    def row(self, table, i):
        table_rows = self.tables.setdefault(table, {})
        if i not in table_rows:
            key = [self.seed, sum(map(ord, table)), i % 2**64]
            table_rows[i] = np.random.default_rng(key).normal(size=self.dim).astype(np.float32)
        return table_rows[i]

    def __call__(self, table, ids):
        with self._lock:
            self.calls.append((table, np.array(ids)))
            return np.stack([self.row(table, i) for i in ids.tolist()])

    def rows(self, table, ids):
        """The rows of `ids` (any shape) as an array of shape `ids.shape + [dim]`."""
        ids = np.asarray(ids, np.int64)
        flat = [self.row(table, i) for i in ids.reshape(-1).tolist()]
        return np.array(flat, np.float32).reshape(ids.shape + (self.dim,))


@pytest.fixture
def store():
    return RowStore(dim=4)
