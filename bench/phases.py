"""Phases: where one worker's DeepFM training step goes, so that the next gap is visible.

One worker's `Trainer` (the overlapped strategy a job uses by default, Adagrad 0.05 as in
the sparse suite's peer comparison) trains `bench/models/deepfm_hashed.py` over 1M-row tables
against one PS shard served over gRPC on 127.0.0.1 from a thread of the same process, so
that both ends' phases can be timed: each is the wall time of one function, summed over the
measured steps and divided by their number. Phases overlap (the push and its fused pull run
in the background while the next step computes; the shard's handlers run on its own
threads), so they do not add up to the step. Sharing one process, both ends also share its
GIL; so the same training runs again against a shard in a process of its own
(`bench.embedding_rows serve`), as in a job, timed on the worker's end alone
(`phases/ps_process/PHASE`).

Lines (`phases/PHASE`, ms per step; `config.calls` per step):

- `step`: the whole step as the task loop sees it (input excluded: batches are in memory);
- `worker_compute`: `Trainer.compute`, the training step with its row pulls;
- `row_pulls`: `PSClient.pull_embeddings`, a step's embedding-row pulls (worker side);
- `push`: `PSClient.push_gradients`, the push and the dense pull it carries (background);
- `dense_pull`: `PSClient.pull_dense`, dense pulls not carried by a push;
- `decode`: `tensor_stream.decode_tensors`, turning answers into arrays (worker side);
- `merge`: `merge_row_gradients`, a step's row gradients per table;
- `assign`: `Trainer.assign`, pulled values into the model;
- `ps_apply`: `Parameters.push`, the shard applying a push (dense and rows);
- `ps_rows`: `Parameters.pull_embeddings`, the shard finding and creating rows.

`--quick`: 30 measured steps after 10 warm-up steps; full: 120 after 20. Run it before
and after a change: the bench prints figures, not a verdict.
"""

import collections
import functools
import os
import time

from bench.common import ROOT, ChildServer, emit, peak_rss_mb
from bench.deepfm import BATCH, click_records

PHASES = {
    "worker_compute": ("elastic_keras.worker.trainer", "Trainer", "compute"),
    "row_pulls": ("elastic_keras.common.ps_client", "PSClient", "pull_embeddings"),
    "push": ("elastic_keras.common.ps_client", "PSClient", "push_gradients"),
    "dense_pull": ("elastic_keras.common.ps_client", "PSClient", "pull_dense"),
    "decode": ("elastic_keras.common.transfer.tensor_stream", None, "decode_tensors"),
    "merge": ("elastic_keras.worker.trainer", None, "merge_row_gradients"),
    "assign": ("elastic_keras.worker.trainer", "Trainer", "assign"),
    "ps_apply": ("elastic_keras.ps.parameters", "Parameters", "push"),
    "ps_rows": ("elastic_keras.ps.parameters", "Parameters", "pull_embeddings"),
}

WORKER_PHASES = [p for p in PHASES if not p.startswith("ps_")]


class Timers:
    """Wraps each phase's function to add up its wall time and calls while `on`."""

    def __init__(self):
        self.seconds = collections.Counter()
        self.calls = collections.Counter()
        self.on = False

    def install(self):
        import importlib

        for phase, (module_name, class_name, attribute) in PHASES.items():
            module = importlib.import_module(module_name)
            owner = getattr(module, class_name) if class_name else module
            setattr(owner, attribute, self._timed(phase, getattr(owner, attribute)))

    def _timed(self, phase, fn):
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.on:
                    self.seconds[phase] += time.perf_counter() - started
                    self.calls[phase] += 1

        return timed


def run(quick, work_dir):
    warmup, steps = (10, 30) if quick else (20, 120)
    timers = Timers()
    timers.install()
    import tensorflow as tf

    from bench.models import deepfm_hashed
    from elastic_keras.common import rpc
    from elastic_keras.common.model_spec import Mode, load_model_spec
    from elastic_keras.ps.parameters import Parameters
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    os.environ[deepfm_hashed.OPTIMIZER_VARIABLE] = "adagrad"
    os.environ[deepfm_hashed.ROWS_VARIABLE] = str(1_000_000)
    data = click_records(work_dir, (warmup + steps) * BATCH)
    files = sorted(str(p) for p in data.glob("*.tfrecord"))
    spec = load_model_spec(str(ROOT), "bench.models.deepfm_hashed")
    batches = list(spec.minibatches(tf.data.TFRecordDataset(files), Mode.TRAINING, None, BATCH))
    config = {"model": "deepfm_hashed", "rows": 1_000_000, "batch": BATCH,
              "optimizer": "adagrad", "strategy": "overlap", "steps": steps, "ps": 1,
              "workers": 1}
    servicer = PServerServicer(Parameters())
    server, port = rpc.create_server([lambda s: add_to_server(servicer, s)], "127.0.0.1")
    try:
        elapsed = _train(spec, f"127.0.0.1:{port}", batches, warmup, timers)
    finally:
        server.stop(0)
    _emit("phases", config, elapsed, timers, PHASES)
    # The shard in a process of its own, as in a job: the worker's phases alone.
    timers.seconds.clear()
    timers.calls.clear()
    with ChildServer("bench.embedding_rows") as ps:
        elapsed = _train(spec, ps.address, batches, warmup, timers)
    _emit("phases/ps_process", {**config, "ps_process": True}, elapsed, timers, WORKER_PHASES)


def _emit(prefix, config, elapsed, timers, phases):
    """The lines of one run: the step (of `config["steps"]` taking `elapsed` seconds) and
    each of `phases`, ms per step."""
    steps = config["steps"]
    emit(f"{prefix}/step", config, 1000 * elapsed / steps, "ms", peak_rss_mb())
    for phase in phases:
        emit(f"{prefix}/{phase}", {**config, "calls": round(timers.calls[phase] / steps, 2)},
             1000 * timers.seconds[phase] / steps, "ms", None)


def _train(spec, address, batches, warmup, timers):
    """Trains `batches` against the shard at `address`; returns the seconds of the steps
    after the first `warmup`, which `timers` time."""
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.worker.trainer import Trainer

    client = PSClient([address], deadline_s=600)
    try:
        trainer = Trainer(spec, client, worker_id=0, strategy="overlap")
        for features, labels in batches[:warmup]:
            trainer.train_minibatch(features, labels)
        trainer.flush()
        timers.on = True
        started = time.perf_counter()
        for features, labels in batches[warmup:]:
            trainer.train_minibatch(features, labels)
        trainer.flush()
        elapsed = time.perf_counter() - started
        timers.on = False
        return elapsed
    finally:
        client.close()
