"""One shard's embedding table: memory per row, pull (`rows`) and push (`apply`) throughput.

`python -m bench.embedding_table [--quick]` prints one JSON line per result:

- `embedding/bytes_per_row`: `EmbeddingTable.nbytes / num_rows` (rows, Adam slots and the
  id map, allocated capacity included) and the resident-memory growth per row, for a table
  filled batch by batch as training fills it; the raw bytes are `dim * 4 * 3`.
- `embedding/rows`: `rows()` of 64k distinct ids already in the table, rows per second.
  The peer, `memory_gather`, is the memory's own limit for that access pattern: `np.take`
  of 64k random rows from a plain array of the table's shape (the gather alone, without
  the id lookup that finds the rows).
- `embedding/apply_adam`: `apply()` of 64k distinct ids with Adam, rows per second.
- `embedding/create_rows`: `rows()` of 64k new ids (initialisation and insertion).

Ids are random int64 values, as hashed features give. `--quick` measures the 1M-row table
only; the full run adds a 10M-row one.
"""

import argparse
import time

import numpy as np

from bench.common import emit, peak_rss_mb

BATCH = 65_536
DIM = 16
ADAM = {"class_name": "Adam", "config": {"learning_rate": 0.001}}


def resident_mb():
    """This process's resident memory now, in MB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def filled_table(num_rows, optimizer, rng):
    from elastic_keras.ps.embedding_table import EmbeddingTable

    table = EmbeddingTable("bench", DIM, "uniform", slot_names=optimizer.slot_names)
    ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, num_rows, dtype=np.int64)
    before = resident_mb()
    for start in range(0, num_rows, BATCH):
        table.rows(ids[start:start + BATCH])
    return table, ids, resident_mb() - before


def best_seconds(function, repeats):
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - started)
    return best


def run(quick, work_dir=None):
    from elastic_keras.ps.sparse_optimizers import from_keras_config

    rng = np.random.default_rng(0)
    optimizer = from_keras_config(ADAM)
    repeats = 5 if quick else 20
    for num_rows in [1_000_000] if quick else [1_000_000, 10_000_000]:
        table, ids, resident = filled_table(num_rows, optimizer, rng)
        config = {"rows": table.num_rows, "dim": DIM, "dtype": "float32", "slots": "adam"}
        raw = DIM * 4 * (1 + len(optimizer.slot_names))
        per_row = table.nbytes / table.num_rows
        emit("embedding/bytes_per_row", {**config, "measure": "nbytes", "raw": raw,
                                         "ratio_to_raw": round(per_row / raw, 3)},
             per_row, "bytes/row", peak_rss_mb())
        resident_per_row = resident * 2**20 / num_rows
        emit("embedding/bytes_per_row", {**config, "measure": "resident growth", "raw": raw,
                                         "ratio_to_raw": round(resident_per_row / raw, 3)},
             resident_per_row, "bytes/row", peak_rss_mb())
        batches = [ids[rng.choice(num_rows, BATCH, replace=False)] for _ in range(repeats)]
        grads = rng.normal(size=(BATCH, DIM)).astype(np.float32)
        step = iter(range(1, 10**9))
        pulls = iter(batches)
        seconds = best_seconds(lambda: table.rows(next(pulls)), repeats)
        plain = np.full((num_rows, DIM), 1.0, np.float32)
        positions = iter(rng.integers(0, num_rows, (repeats, BATCH)))
        peer_seconds = best_seconds(lambda: np.take(plain, next(positions), axis=0), repeats)
        plain = None
        emit("embedding/rows", {**config, "batch": BATCH, "ids": "distinct, present"},
             BATCH / seconds, "rows/s", peak_rss_mb(), peer="memory_gather",
             peer_value=BATCH / peer_seconds)
        pushes = iter(batches)
        seconds = best_seconds(lambda: table.apply(next(pushes), grads, optimizer, next(step)),
                               repeats)
        emit("embedding/apply_adam", {**config, "batch": BATCH, "ids": "distinct, present"},
             BATCH / seconds, "rows/s", peak_rss_mb())
        fresh = iter(rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max,
                                  (repeats, BATCH), dtype=np.int64))
        seconds = best_seconds(lambda: table.rows(next(fresh)), repeats)
        emit("embedding/create_rows", {**config, "batch": BATCH, "ids": "distinct, new"},
             BATCH / seconds, "rows/s", peak_rss_mb())
        table = None  # frees the table before the next is filled


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.embedding_table", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the 1M-row table only")
    run(parser.parse_args().quick)


if __name__ == "__main__":
    main()
