"""Scaling shape: DeepFM examples/s as the embedding tables grow, and as workers are added.

`python -m bench scaling [--quick]`:

- `scaling/table_rows`: one worker's training steps (the real `elastic_keras.worker`
  `Trainer`, overlapping push and pull with compute as a job does) against one PS process
  whose two DeepFM tables (`fm_linear` dim 1, `fm_factors` dim 16) hold 1M, then 10M, then
  (full run) 100M rows. The tables are filled between measurements by pulling new ids, as
  training creates rows; the model's ids are hashed into the largest size, so every
  measurement trains on the same 40 batches (after a pass over them that creates their rows,
  and 5 more steps after each fill), the fastest of 3 passes. A step's cost should not grow
  with the table: `peer` is the smallest table's figure and `ratio` this one over it. The
  optimizer is SGD, which keeps no per-row slots: with Adam's two, 100M rows of dim 16 would
  be 19 GB for `fm_factors` alone, about 30 GB on the PS with the id maps, more than this
  machine's 23 GB; with SGD the PS holds about 14 GB at 100M rows. `config.ps_rss_mb` is
  the PS process's resident memory at that size.
- `scaling/workers`: elastic_keras DeepFM jobs (1M rows, 1 PS, batch 512) with 1, 2 and 4
  workers (full run only); `peer` is the 1-worker job, `ratio` the speed-up.

`python -m bench.scaling tables DATA ROWS...` is the child that measures the tables.
"""

import json
import sys
import time

import numpy as np

from bench.common import ROOT, ChildServer, attempt, emit, minibatches, peak_rss_mb, run_child

FILL_BATCH = 65_536
BATCH = 512
MODEL_DEF = "bench.models.deepfm_hashed"
STEPS = 40
WARMUP_STEPS = 5
REPEATS = 3  # passes over the batches per size; the fastest counts (others share the cores)
TABLES = {"fm_linear": 1, "fm_factors": 16}


def _batches(data, count):
    """`count` minibatches `(features, labels)` of the click records, held in memory."""
    import tensorflow as tf

    files = sorted(str(p) for p in data.glob("*.tfrecord"))
    records = tf.data.TFRecordDataset(files).repeat()
    return list(minibatches(MODEL_DEF, records, BATCH).take(count))


def _train(trainer, batches):
    """Seconds `trainer` takes to train on `batches`, its last push landed."""
    started = time.perf_counter()
    for features, labels in batches:
        trainer.train_minibatch(features, labels)
    trainer.flush()
    return time.perf_counter() - started


def tables_side(data, sizes):
    """The child: prints `{"results": [{rows, value, ps_rss_mb, fill_rows_per_s}...],
    "rss": MB}`."""
    import os

    from bench.models import deepfm_hashed
    from elastic_keras.common.model_spec import load_model_spec
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.worker.trainer import Trainer

    os.environ[deepfm_hashed.ROWS_VARIABLE] = str(max(sizes))
    os.environ[deepfm_hashed.OPTIMIZER_VARIABLE] = "sgd"
    spec = load_model_spec(str(ROOT), MODEL_DEF)
    batches = _batches(data, WARMUP_STEPS + STEPS)
    results = []
    with ChildServer("bench.embedding_rows") as ps:
        client = PSClient([ps.address], deadline_s=600)
        filler = PSClient([ps.address], deadline_s=600)
        try:
            trainer = Trainer(spec, client, worker_id=0, strategy="overlap")
            # Builds the model, creates the tables and every row the batches touch, so that
            # each measurement times steps over rows that exist.
            _train(trainer, batches)
            filled = 0
            for rows in sorted(sizes):
                started = time.perf_counter()
                for start in range(filled, rows, FILL_BATCH):
                    ids = np.arange(start, min(rows, start + FILL_BATCH), dtype=np.int64)
                    filler.pull_embeddings({table: ids for table in TABLES})
                fill_seconds = time.perf_counter() - started
                _train(trainer, batches[:WARMUP_STEPS])
                best = min(_train(trainer, batches[WARMUP_STEPS:]) for _ in range(REPEATS))
                value = STEPS * BATCH / best
                results.append({"rows": rows, "value": value,
                                "ps_rss_mb": round(ps.resident_mb(), 1),
                                "ps_peak_rss_mb": round(ps.peak_rss_mb(), 1),
                                "fill_rows_per_s": round((rows - filled) / fill_seconds)})
                filled = rows
        finally:
            client.close()
            filler.close()
    print(json.dumps({"results": results, "rss": peak_rss_mb()}))


def measure_tables(data, sizes):
    result, error = attempt("table scaling", run_child, "bench.scaling", "tables", data,
                            *sizes, timeout_s=1800)
    if error:
        emit("scaling/table_rows", {"rows": list(sizes)}, None, "examples/s", None,
             error=error)
        return
    first = result["results"][0]
    for row in result["results"]:
        config = {"rows": row["rows"], "hashed_into": max(sizes), "tables": TABLES,
                  "optimizer": "sgd", "batch": BATCH, "steps": STEPS, "workers": 1, "ps": 1,
                  "ps_rss_mb": row["ps_rss_mb"], "fill_rows_per_s": row["fill_rows_per_s"]}
        emit("scaling/table_rows", config, row["value"], "examples/s",
             max(result["rss"], row["ps_peak_rss_mb"]), peer=f"{first['rows']} rows",
             peer_value=first["value"])


def measure_workers(data, records, worker_counts):
    from bench.deepfm import BATCH as JOB_BATCH

    first = None
    for workers in worker_counts:
        result, error = attempt(f"deepfm job with {workers} workers", run_child,
                                "bench.deepfm", "elastic", data, 1_000_000, 1, 1, workers)
        value = result and result["value"]
        if first is None:
            first = value
        emit("scaling/workers", {"workers": workers, "ps": 1, "rows": 1_000_000,
                                 "batch": JOB_BATCH, "records": records},
             value, "examples/s", result and result["rss"],
             peer=f"{worker_counts[0]} worker", peer_value=first, error=error)


def run(quick, work_dir):
    from bench.deepfm import FULL_RECORDS, QUICK_RECORDS, click_records

    # The sparse suite's records (generated once per run): enough batches for the tables,
    # and, in the full run, 8 tasks of 8 steps for the jobs.
    records = QUICK_RECORDS if quick else FULL_RECORDS
    data, error = attempt("generating click records", click_records, work_dir, records)
    if error:
        emit("scaling/table_rows", {}, None, "examples/s", None, error=error)
        return
    measure_tables(data, [1_000_000, 10_000_000] if quick else [1_000_000, 10_000_000,
                                                                 100_000_000])
    if not quick:
        measure_workers(data, records, [1, 2, 4])


def main():
    import pathlib

    side, data, *sizes = sys.argv[1:]
    if side != "tables":
        raise SystemExit(f"usage: python -m bench.scaling tables DATA ROWS...; got {side!r}")
    tables_side(pathlib.Path(data), [int(s) for s in sizes])


if __name__ == "__main__":
    main()
