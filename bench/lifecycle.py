"""A table under a row budget fed a stream of new ids: memory and row throughput.

`python -m bench lifecycle [--quick]` (not in `all`) prints one JSON line per result. Two PS
processes on 127.0.0.1 (`python -m bench.embedding_rows serve`: a real shard, no master),
each with one table of dim 16 and Adam:

- the budgeted PS's table has `max_rows` = 1M. It receives a stream of steps, each one
  pull and one push of 16,384 distinct ids, as a worker's step sends them: 8,192 draws from
  a Zipf(1.2) head of 100k ids (the same hot ids all run long; about 1.5k distinct a
  step), the rest new ids never seen before (a new tail every step), until 20M distinct ids
  (`--quick`: 5M) were sent.
  `lifecycle/memory` is its resident memory after 2M, 10M and 20M ids, beside the first
  (`lifecycle/memory_flat`: the last beside the first, whose ratio should stay below 1.10);
  `lifecycle/growth_per_row` is its resident memory's growth from its first step to the
  end, per row of its budget, less the raw bytes of a row and its slots
  (`config.raw_bytes`): this counts the memory a PS holds for its work whatever its rows
  (buffers, the allocator's free lists) as if rows held it;
- a third PS, with twice the budget, is sent twice as many ids as the first was at its first
  mark (2M): `lifecycle/bytes_per_row` is what the second million rows cost, less their raw
  bytes (the two PS's growth from their first step, at the same point of their streams: full
  and evicting): a row's own cost beyond its data.
- the same PS without a budget receives the same steps until it holds 1M rows: the peer of
  `lifecycle/pull` and `lifecycle/push`, rows per second of the budgeted PS over its steps
  after 2M ids (when it evicts as fast as new ids come), against the unbudgeted one's over
  its 50 steps after it reached 1M rows (to about 1.75M): the medians of the calls' rates
  (a typical step), and in `config` the means (all rows over all time: the budgeted PS's
  include its evictions, the other's its arrays' growth).
"""

import argparse
import json
import time

import numpy as np

from bench.common import ChildServer, emit
from bench.embedding_rows import ADAM, DIM, TABLE, Pusher

BUDGET = 1_000_000
STEP_IDS = 16_384
HEAD = 100_000
CHECKPOINTS = (2_000_000, 10_000_000, 20_000_000)
PEER_STEPS = 50  # the unbudgeted PS grows from 1M rows to about 1.75M over them


class Stream:
    """Steps of ids: half a Zipf draw from a fixed head, half ids never sent before."""

    def __init__(self, seed=0):
        self._rng = np.random.default_rng(seed)
        self._head = self._rng.integers(1, 2**62, HEAD, dtype=np.int64)
        self._next_new = -1  # new ids count down from -1: never in the head
        self.distinct = 0

    def step(self):
        ranks = np.minimum(self._rng.zipf(1.2, STEP_IDS // 2), HEAD) - 1
        hot = np.unique(self._head[ranks])
        new = np.arange(self._next_new, self._next_new - (STEP_IDS - len(hot)), -1)
        self._next_new -= len(new)
        self.distinct += len(new)
        return np.concatenate([hot, new])


def _timed(call):
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _run_steps(client, pusher, stream, grads, until, timings=None):
    """Steps until `until()` is true; appends (pull s, push s, ids) to `timings`."""
    while not until():
        ids = stream.step()
        pull = _timed(lambda: client.pull_embeddings({TABLE: ids}))
        push = _timed(lambda: pusher.push(ids, grads[:len(ids)]))
        if timings is not None:
            timings.append((pull, push, len(ids)))


def _rates(timings):
    """(median pull, median push, mean pull, mean push) rows per second: the median is a
    typical step, the mean (all rows over all time) counts the steps that evicted."""
    pulls, pushes, sizes = (np.array(column) for column in zip(*timings))
    return (float(np.median(sizes / pulls)), float(np.median(sizes / pushes)),
            float(sizes.sum() / pulls.sum()), float(sizes.sum() / pushes.sum()))


def _start(ps, max_rows):
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2

    client = PSClient([ps.address], deadline_s=600)
    spec = pserver_pb2.EmbeddingTableSpec(name=TABLE, dim=DIM, dtype="float32",
                                          initializer="uniform")
    if max_rows:
        spec.max_rows = max_rows
    client.init_model({"bias": np.zeros(1, np.float32)}, json.dumps(ADAM), [spec])
    return client


def _growth(budget, distinct_ids, grads):
    """The resident-memory growth (MB) of a PS with a table of `budget` rows from its first
    step until it was sent `distinct_ids` ids."""
    with ChildServer("bench.embedding_rows") as ps:
        client = _start(ps, budget)
        try:
            stream, pusher = Stream(), Pusher(client)
            _run_steps(client, pusher, stream, grads, lambda: stream.distinct >= STEP_IDS)
            start_mb = ps.resident_mb()
            _run_steps(client, pusher, stream, grads, lambda: stream.distinct >= distinct_ids)
            return ps.resident_mb() - start_mb
        finally:
            client.close()


def run(quick, work_dir=None):
    """Prints every result of this suite; `work_dir` is unused."""
    marks = CHECKPOINTS[:1] + (5_000_000,) if quick else CHECKPOINTS
    grads = np.random.default_rng(1).normal(size=(STEP_IDS, DIM)).astype(np.float32) * 1e-3
    config = {"dim": DIM, "optimizer": "adam", "budget_rows": BUDGET, "step_ids": STEP_IDS,
              "ps": 1, "transport": "grpc 127.0.0.1"}
    with ChildServer("bench.embedding_rows") as ps:
        client = _start(ps, BUDGET)
        try:
            stream, pusher = Stream(), Pusher(client)
            _run_steps(client, pusher, stream, grads, lambda: stream.distinct >= STEP_IDS)
            start_mb = ps.resident_mb()  # one step in: the first pull and push are done
            memory, budgeted = [], []
            for mark in marks:
                _run_steps(client, pusher, stream, grads, lambda: stream.distinct >= mark,
                           budgeted if mark > marks[0] else None)
                memory.append(ps.resident_mb())
                emit("lifecycle/memory", {**config, "distinct_ids": stream.distinct},
                     memory[-1], "MB", ps.peak_rss_mb())
            raw = DIM * 4 * 3
            emit("lifecycle/growth_per_row", {**config, "raw_bytes": raw},
                 (memory[-1] - start_mb) * 2**20 / BUDGET - raw, "B beyond raw",
                 ps.peak_rss_mb())
            emit("lifecycle/memory_flat", {**config, "distinct_ids": marks[-1],
                                           "start_mb": round(start_mb, 1)},
                 memory[-1], "MB", ps.peak_rss_mb(), peer=f"memory_at_{marks[0]}_ids",
                 peer_value=memory[0])
        finally:
            client.close()
    twice = _growth(2 * BUDGET, 2 * marks[0], grads)
    emit("lifecycle/bytes_per_row", {**config, "raw_bytes": raw, "peer_budget_rows": 2 * BUDGET,
                                     "growth_mb": round(memory[0] - start_mb, 1),
                                     "peer_growth_mb": round(twice, 1)},
         (twice - (memory[0] - start_mb)) * 2**20 / BUDGET - raw, "B beyond raw", None)
    with ChildServer("bench.embedding_rows") as ps:
        client = _start(ps, 0)
        try:
            stream, pusher, unbudgeted = Stream(), Pusher(client), []
            _run_steps(client, pusher, stream, grads, lambda: stream.distinct >= BUDGET)
            _run_steps(client, pusher, stream, grads,
                       lambda: len(unbudgeted) >= PEER_STEPS, unbudgeted)
        finally:
            client.close()
    ours, peer = _rates(budgeted), _rates(unbudgeted)
    for i, what in enumerate(("pull", "push")):
        emit(f"lifecycle/{what}", {**config, "steps": len(budgeted),
                                   "peer_steps": len(unbudgeted), "statistic": "median",
                                   "mean": round(ours[i + 2]), "peer_mean": round(peer[i + 2])},
             ours[i], "rows/s", None, peer="no_budget_at_1M_rows", peer_value=peer[i])


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.lifecycle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="5M distinct ids, not 20M")
    run(parser.parse_args().quick)


if __name__ == "__main__":
    main()
