"""Embedding rows over gRPC: pull and push throughput and PS memory per row, beside raw gRPC.

`python -m bench.embedding_rows [--quick]` (part of `python -m bench micro`) prints one JSON
line per result. One PS process on 127.0.0.1 serves a real shard (`PServerServicer(
Parameters())`, no master) with one table of dim 16 and Adam; this process fills the table
(by pulling new ids, as training creates rows) to 1M rows, measures, fills it on to 10M
rows, measures again:

- `embedding_rows/pull`, `embedding_rows/push`: rows per second of `PSClient.pull_embeddings`
  and of `PSClient.push_gradients` with embedding gradients (Adam on the PS), for 1k, 16k
  and 64k distinct ids already in the table, drawn at random from its ids; each figure the
  best of several calls, each with other ids. The peer, `raw_grpc_bytes`, is
  `bench.raw_grpc` (another process on 127.0.0.1) in the same run: one unary call moving the
  same bytes (ids up and rows down for a pull; ids and gradient rows up for a push), best
  of as many calls.
- `embedding_rows/ps_memory`: the PS process's resident-memory growth per million rows while the
  table was filled (rows, Adam's two slots, the id map); `config.raw_mb` is the raw bytes of
  a million rows and their slots (dim * 4 bytes * 3); `config.fill_rows_per_s`.

`peak_rss_mb` is this (client) process's, except for `embedding_rows/ps_memory`, where it is the PS
process's resident memory once the table is filled. `--quick`: 5 calls per figure instead
of 10. `python -m bench.embedding_rows serve` is the PS process.
"""

import argparse
import json
import sys
import time

import numpy as np

from bench.common import ChildServer, emit, peak_rss_mb, serve_until_stdin_closes
from bench.raw_grpc import RawPeer

DIM = 16
TABLE = "items"
FILL_BATCH = 65_536
BATCHES = (1_024, 16_384, 65_536)
TABLE_ROWS = (1_000_000, 10_000_000)
ADAM = {"class_name": "Adam", "config": {"learning_rate": 0.001}}


def serve():
    """Serves one PS shard on 127.0.0.1; prints the port; returns when stdin closes."""
    from elastic_keras.common import rpc
    from elastic_keras.ps.parameters import Parameters
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    servicer = PServerServicer(Parameters())
    serve_until_stdin_closes([rpc.create_server(
        [lambda s: add_to_server(servicer, s)])])


def best_rate(call, batches):
    """Rows per second of the fastest of `call(batch)` over `batches` (equal sizes)."""
    best = float("inf")
    for batch in batches:
        started = time.perf_counter()
        call(batch)
        best = min(best, time.perf_counter() - started)
    return len(batches[0]) / best


class Pusher:
    """Pushes embedding gradients as one worker does: the next sequence, the current version."""

    def __init__(self, client):
        self._client = client
        self._sequence = 0
        self._versions = [0] * client.num_ps

    def push(self, ids, grads):
        self._sequence += 1
        responses = self._client.push_gradients(
            0, self._sequence, self._versions, {}, None, {TABLE: (ids, grads)})
        if not all(r.accepted for r in responses):
            raise RuntimeError(f"the PS rejected a push: {responses}")
        self._versions = [r.model_version for r in responses]


def fill(client, ids):
    """Creates the rows of `ids` on the PS, a batch at a time; returns the seconds it took."""
    started = time.perf_counter()
    for start in range(0, len(ids), FILL_BATCH):
        client.pull_embeddings({TABLE: ids[start:start + FILL_BATCH]})
    return time.perf_counter() - started


def measure(client, raw, ps, ids, repeats, rng):
    """Emits the pull and push figures of a table holding `ids`."""
    config = {"rows": len(ids), "dim": DIM, "optimizer": "adam", "ps": 1,
              "transport": "grpc 127.0.0.1"}
    pusher = Pusher(client)
    for size in BATCHES:
        batches = [np.unique(ids[rng.choice(len(ids), size, replace=False)])
                   for _ in range(repeats)]
        grads = rng.normal(size=(size, DIM)).astype(np.float32)
        row_bytes = DIM * 4
        raw_pull = best_rate(lambda b: raw.exchange(b.nbytes, len(b) * row_bytes), batches)
        raw_push = best_rate(lambda b: raw.exchange(b.nbytes + len(b) * row_bytes, 0), batches)
        rate = best_rate(lambda b: client.pull_embeddings({TABLE: b}), batches)
        emit("embedding_rows/pull", {**config, "ids": size, "repeats": repeats}, rate, "rows/s",
             peak_rss_mb(), peer="raw_grpc_bytes", peer_value=raw_pull)
        rate = best_rate(lambda b: pusher.push(b, grads[:len(b)]), batches)
        emit("embedding_rows/push", {**config, "ids": size, "repeats": repeats}, rate, "rows/s",
             peak_rss_mb(), peer="raw_grpc_bytes", peer_value=raw_push)


def run(quick, work_dir=None):
    """Prints every result of this suite; `work_dir` is unused."""
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2

    rng = np.random.default_rng(0)
    repeats = 5 if quick else 10
    ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, TABLE_ROWS[-1],
                       dtype=np.int64)
    with ChildServer("bench.raw_grpc") as raw_server, ChildServer("bench.embedding_rows") as ps:
        raw = RawPeer(raw_server.address)
        client = PSClient([ps.address], deadline_s=600)
        try:
            client.init_model({"bias": np.zeros(1, np.float32)}, json.dumps(ADAM), [
                pserver_pb2.EmbeddingTableSpec(name=TABLE, dim=DIM, dtype="float32",
                                               initializer="uniform")])
            filled = 0
            for rows in TABLE_ROWS:
                before = ps.resident_mb()
                seconds = fill(client, ids[filled:rows])
                grown = ps.resident_mb() - before
                emit("embedding_rows/ps_memory",
                     {"rows": rows, "dim": DIM, "optimizer": "adam", "ps": 1,
                      "raw_mb": round(DIM * 4 * 3 * 1e6 / 2**20, 1),
                      "fill_rows_per_s": round((rows - filled) / seconds)},
                     grown / ((rows - filled) / 1e6), "MB/million rows", ps.resident_mb())
                filled = rows
                measure(client, raw, ps, ids[:rows], repeats, rng)
        finally:
            client.close()
            raw.close()


def main():
    if sys.argv[1:2] == ["serve"]:
        return serve()
    parser = argparse.ArgumentParser(prog="python -m bench.embedding_rows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer calls per figure")
    run(parser.parse_args().quick)


if __name__ == "__main__":
    main()
