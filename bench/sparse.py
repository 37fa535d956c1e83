"""Embedding rows over gRPC: pull and push throughput, PS memory per row, a census job.

`python -m bench.sparse [--quick]` prints one JSON line per result:

- `sparse/pull_rows`, `sparse/push_rows`: rows per second of `PSClient.pull_embeddings`
  and of `PSClient.push_gradients` with embedding gradients (Adam on the PS), for 1k, 16k and
  64k distinct ids of dim 16 already in the table, from this process to one PS process on
  127.0.0.1, against tables pre-filled to 1M and 10M rows (`--quick`: 1M). Each figure is
  the best of several calls, each with other ids, drawn at random from the table's ids.
- `sparse/ps_memory`: the PS process's resident-memory growth per million rows while the
  table is filled (rows, Adam's two slots and the id map); `config.raw_mb` is the raw bytes of
  a million rows and their slots (dim * 4 bytes * 3).
- `sparse/census_job`: examples/s of the census wide & deep job (2 workers, 2 PS, 2 epochs)
  when ../shared/data holds adult.csv.gz.

`peak_rss_mb` is this (client) process's, except for `sparse/ps_memory`, where it is the PS
process's resident memory once the table is filled.

The PS process serves a real shard (`PServerServicer(Parameters())`) on its own, without a
master: `python -m bench.sparse serve` prints its port and serves until stdin closes.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from bench.common import ROOT, SHARED_DATA, emit, peak_rss_mb, run_child

DIM = 16
TABLE = "items"
FILL_BATCH = 65_536
BATCHES = (1_024, 16_384, 65_536)
ADAM = {"class_name": "Adam", "config": {"learning_rate": 0.001}}


def serve():
    """Serves one PS shard on 127.0.0.1; prints the port; returns when stdin closes."""
    from elastic_keras.common import rpc
    from elastic_keras.proto import pserver_pb2_grpc
    from elastic_keras.ps.parameters import Parameters
    from elastic_keras.ps.servicer import PServerServicer

    servicer = PServerServicer(Parameters())
    server, port = rpc.create_server(
        [lambda s: pserver_pb2_grpc.add_PServerServicer_to_server(servicer, s)])
    print(port, flush=True)
    sys.stdin.read()
    server.stop(0)


class PSProcess:
    """A `python -m bench.sparse serve` child: its address and resident memory."""

    def __init__(self):
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.sparse", "serve"], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR"},
        )
        line = self._process.stdout.readline()
        if not line.strip().isdigit():
            self.close()
            raise RuntimeError(f"the PS process did not start: {line!r}")
        self.address = f"127.0.0.1:{int(line)}"

    def resident_mb(self):
        with open(f"/proc/{self._process.pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    def close(self):
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def _best_rate(call, batches):
    best = float("inf")
    for batch in batches:
        started = time.perf_counter()
        call(batch)
        best = min(best, time.perf_counter() - started)
    return len(batches[0]) / best


def measure_table(num_rows, repeats, rng):
    """Fills a fresh PS process's table to `num_rows` rows and measures it; emits results."""
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2

    ps = PSProcess()
    client = PSClient([ps.address], deadline_s=600)
    try:
        client.init_model({"bias": np.zeros(1, np.float32)}, json.dumps(ADAM), [
            pserver_pb2.EmbeddingTableSpec(name=TABLE, dim=DIM, dtype="float32",
                                           initializer="uniform")])
        ids = rng.integers(np.iinfo(np.int64).min, np.iinfo(np.int64).max, num_rows,
                           dtype=np.int64)
        before = ps.resident_mb()
        started = time.perf_counter()
        for start in range(0, num_rows, FILL_BATCH):
            client.pull_embeddings({TABLE: ids[start:start + FILL_BATCH]})
        fill_seconds = time.perf_counter() - started
        grown = ps.resident_mb() - before
        config = {"rows": num_rows, "dim": DIM, "optimizer": "adam", "ps": 1,
                  "transport": "grpc 127.0.0.1"}
        emit("sparse/ps_memory", {**config, "raw_mb": round(DIM * 4 * 3 * 1e6 / 2**20, 1),
                                  "fill_rows_per_s": round(num_rows / fill_seconds)},
             grown / (num_rows / 1e6), "MB/million rows", ps.resident_mb())
        pusher = _Pusher(client)
        for size in BATCHES:
            batches = [np.unique(ids[rng.choice(num_rows, size, replace=False)])
                       for _ in range(repeats)]
            grads = rng.normal(size=(size, DIM)).astype(np.float32)
            rate = _best_rate(lambda b: client.pull_embeddings({TABLE: b}), batches)
            emit("sparse/pull_rows", {**config, "ids": size}, rate, "rows/s", peak_rss_mb())
            rate = _best_rate(lambda b: pusher.push(b, grads[:len(b)]), batches)
            emit("sparse/push_rows", {**config, "ids": size}, rate, "rows/s", peak_rss_mb())
    finally:
        client.close()
        ps.close()


class _Pusher:
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


def census_side(epochs):
    """The census job in this process; prints {"value": examples/s, "accuracy": ...}."""
    import elastic_keras

    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "adult")
        subprocess.run(
            [sys.executable, "-m", "elastic_keras", "data", str(SHARED_DATA / "adult.csv.gz"),
             "--format", "csv", "--holdout-every", "5", "--shuffle", "--output", data],
            cwd=ROOT, check=True, capture_output=True,
        )
        summary = elastic_keras.train(
            model_zoo="model_zoo", model_def="census.wide_deep",
            training_data=os.path.join(data, "train"),
            validation_data=os.path.join(data, "test"), num_workers=2, num_ps=2,
            minibatch_size=128, num_epochs=epochs, output=os.path.join(work, "out"),
            log_level="warning",
        )
        if summary.status.value != "succeeded":
            raise SystemExit(f"census job failed: {summary.error}")
        metrics = summary.evaluations[-1]["metrics"]
        print(json.dumps({"value": summary.examples_per_second, "rss": peak_rss_mb(),
                          "accuracy": metrics["accuracy"]}))


def run(quick, work_dir=None):
    rng = np.random.default_rng(0)
    for num_rows in [1_000_000] if quick else [1_000_000, 10_000_000]:
        measure_table(num_rows, 5 if quick else 10, rng)
    if (SHARED_DATA / "adult.csv.gz").exists():
        epochs = 2
        result = run_child("bench.sparse", "census", epochs)
        emit("sparse/census_job",
             {"workers": 2, "ps": 2, "minibatch": 128, "epochs": epochs,
              "records_per_epoch": 39073, "held_out_accuracy": round(result["accuracy"], 4)},
             result["value"], "examples/s", result["rss"])


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.sparse", description=__doc__)
    parser.add_argument("side", nargs="?", choices=["serve", "census"],
                        help=argparse.SUPPRESS)
    parser.add_argument("epochs", nargs="?", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="the 1M-row table only")
    args = parser.parse_args()
    if args.side == "serve":
        serve()
    elif args.side == "census":
        census_side(args.epochs)
    else:
        run(args.quick)


if __name__ == "__main__":
    main()
