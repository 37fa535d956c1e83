"""Sparse: DeepFM over hashed tables, elastic_keras against ParameterServerStrategy, plain
Keras 3 `fit` and a `tf.function` training loop in one process.

Data: a synthetic click log (`model_zoo.deepfm.generate`, Criteo-shaped: 13 counts, 26
categorical ids per example, 10,000 values per field with Zipf popularity, so 260,000
distinct ids). Model: `bench/models/deepfm_hashed.py`, whose ids are hashed into two tables of
`rows` rows (`fm_linear`, dim 1; `fm_factors`, dim 16), for 1M and 10M rows; batch 512.
Every comparison runs twice, with Adagrad (learning rate 0.05) and with Adam (0.002), the
line's `config.optimizer`. Sides:

- `elastic_keras`: a job with 2 workers and 1 or 2 PS (asynchronous, default transfer
  settings, no export); the tables live on the PS, a row created on first use; the PS's
  optimizer updates the rows a batch touches (and their slots);
- `pss`: `bench.pss` with the same worker and PS counts (plus its chief), the tf_keras
  rebuild of the model, each table sharded over the PS by the `MinSizePartitioner`;
  tf_keras's Adagrad updates only the rows a batch touches, as ours does (the peer's best
  case), while its Adam decays both slots of every row and updates every row, on the PS,
  at each step (`tf_keras.optimizers.Adam.update_step`);
- `keras_fit`: `model.fit` of the Keras 3 model with plain `keras.layers.Embedding` tables
  in one process; Keras 3's Adam updates every row of both tables (and their slots) at
  each step;
- `tf_function_loop`: the strategy's tf_keras rebuild trained by a `tf.function` step in a
  Python loop in one process, no `fit` around it (Adagrad applied to the rows a batch
  touches): what one process does with the machine's cores, the most a job on the same
  cores could hope to approach.

Figures are examples/s from the first step (tracing included) to the last; steps of
`batch` records, as many examples on every side. Against `fit` over 1M rows, both sides make
2 passes, and `sparse/deepfm/steady` counts the second only: a job's first pass also holds
its workers' model build and tracing, which `fit` does before its first step or not at all
(see `bench.dense`). Against the strategy, which makes one pass, elastic_keras's figure is
that of its first pass. One line per comparison: `value` is
elastic_keras's, `peer_value` the peer's; `config.seconds` per side, `wall_s` (process
start-up included) and `measured_s` (the time the figure is over).

`--quick`: the 1M-row tables, 1 PS, 16,384 records (32 steps). The full run: 1M rows over
32,768 records and 10M rows over 8,192 (the peers' steps take seconds there), 1 and 2 PS.
`census()` (`python -m bench census`, not in the sparse suite) times the census wide & deep
zoo job on ../shared/data/adult.csv.gz.
"""

import json
import os
import pathlib
import sys
import tempfile
import time

from bench import dense_limit, pss
from bench.common import (
    ROOT, SHARED_DATA, attempt, emit, epoch_seconds, errors, minibatches, peak_rss_mb,
    run_child, run_side, side_times, steady_rate,
)

BATCH = 512
# Adagrad first: TensorFlow applies it sparsely, the peers' best case; Adam's slots decay on
# every row of the peers' tables at every step.
OPTIMIZERS = ("adagrad", "adam")
WORKERS = 2
VOCAB_SIZE = 10_000  # the generator's default
MODEL_DEF = "bench.models.deepfm_hashed"
QUICK_RECORDS = 16_384
FULL_RECORDS = 32_768
# The peers update every row of the tables at each step, so a step at 10M rows takes them
# seconds: the 10M-row comparison runs over fewer records (on every side alike).
LARGE_TABLE_RECORDS = 8_192


def click_records(work_dir, records):
    """`records` synthetic click-log examples in 4 TFRecord files; returns their folder."""
    out = pathlib.Path(work_dir) / f"clicks-{records}"
    if not out.is_dir():
        partial = out.with_name(out.name + ".partial")
        run_child("model_zoo.deepfm.generate", "--output", partial, "--rows", records,
                  "--num-shards", 4, timeout_s=600, json_result=False)
        partial.rename(out)
    return out


def print_result(value, measured_s, **more):
    """The child's answer line (`run_child` reads the last line printed)."""
    print(json.dumps({"value": value, "rss": peak_rss_mb(), "measured_s": round(measured_s, 1),
                      **more}), flush=True)


def fit_side(data, rows, records, epochs):
    """Plain Keras 3 `fit` in this process: examples/s over every epoch, and `steady`, over
    the epochs after the first."""
    import keras
    import tensorflow as tf

    from bench.models import deepfm_hashed

    files = sorted(str(p) for p in pathlib.Path(data).glob("*.tfrecord"))
    raw = tf.data.TFRecordDataset(files)
    dataset = minibatches(MODEL_DEF, raw, BATCH).prefetch(tf.data.AUTOTUNE)
    model = deepfm_hashed.build_model(rows, plain=True)
    model.compile(optimizer=deepfm_hashed.optimizer(), loss=deepfm_hashed.loss)
    ends = []
    timer = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()))
    started = time.perf_counter()
    model.fit(dataset, epochs=epochs, verbose=0, callbacks=[timer])
    elapsed = time.perf_counter() - started
    print_result(records * epochs / elapsed, elapsed,
                 steady=steady_rate(records, epoch_seconds(started, ends)))


def elastic_side(data, rows, ps, epochs, workers=WORKERS, tls="off"):
    """An elastic_keras job of `workers` workers and `ps` PS (`tls` its --tls): examples/s
    over every epoch, `first_epoch` over the first (as many examples as the strategy's run)
    and `steady` over the epochs after the first."""
    import elastic_keras
    from bench.models.deepfm_hashed import ROWS_VARIABLE

    os.environ[ROWS_VARIABLE] = str(rows)  # every role builds the model with this many rows
    summary = elastic_keras.train(
        model_zoo=str(ROOT), model_def=MODEL_DEF, training_data=str(data),
        num_workers=workers, num_ps=ps, minibatch_size=BATCH, num_epochs=epochs,
        log_level="warning", tls=tls,
    )
    if summary.status.value != "succeeded":
        raise SystemExit(f"job failed: {summary.error}")
    seconds = [e["training_s"] for e in summary.epochs]
    records = summary.epochs[0]["records"]
    print_result(summary.examples_per_second, summary.training_time_s,
                 first_epoch=records / seconds[0], steady=steady_rate(records, seconds))


def loop_side(data, rows, records, epochs):
    """The same model trained by a `tf.function` step in a Python loop in this process, no
    `fit` around it: what one process does with the machine's cores. The model is the
    strategy's tf_keras rebuild (`bench.pss_models`), whose Adagrad TensorFlow applies to
    the rows a batch touches (Keras 3's updates every row of a plain table). Examples/s over
    every epoch, and `steady`, over the epochs after the first."""
    import tensorflow as tf

    from bench.pss_models import MODELS

    spec = MODELS["deepfm"]
    files = sorted(str(p) for p in pathlib.Path(data).glob("*.tfrecord"))
    dataset = spec.minibatches(tf.data.TFRecordDataset(files), BATCH).prefetch(
        tf.data.AUTOTUNE)
    _, started, ends = dense_limit.train_epochs(spec.build(rows), spec.loss(), spec.optimizer(),
                                                dataset, epochs)
    elapsed = ends[-1] - started
    print_result(records * epochs / elapsed, elapsed,
                 steady=steady_rate(records, epoch_seconds(started, ends)))


def census_side(epochs):
    """The census wide & deep job (2 workers, 2 PS); prints examples/s and accuracy."""
    import subprocess

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
            minibatch_size=128, num_epochs=epochs, log_level="warning",
        )
        if summary.status.value != "succeeded":
            raise SystemExit(f"census job failed: {summary.error}")
        metrics = summary.evaluations[-1]["metrics"]
        print(json.dumps({"value": summary.examples_per_second, "rss": peak_rss_mb(),
                          "accuracy": metrics["accuracy"]}))


def compare(data, rows, records, ps_counts, epochs, optimizer):
    """Runs every side for one table size and optimizer (a name of
    `deepfm_hashed.OPTIMIZERS`); emits a line per comparison.

    Against `fit`, over `epochs` passes (`sparse/deepfm`) and, with 2 or more, over the
    passes after the first (`sparse/deepfm/steady`); against a `tf.function` loop in one
    process (`loop_side`), over `epochs` passes; against the strategy, which runs one pass,
    elastic_keras's first pass.
    """
    from bench.models.deepfm_hashed import OPTIMIZER_VARIABLE

    os.environ[OPTIMIZER_VARIABLE] = optimizer  # read by every side's model module
    files = sorted(data.glob("*.tfrecord"))
    steps = records // BATCH
    fit, fit_error = run_side(f"keras fit deepfm {rows} rows", run_child, "bench.deepfm",
                              "fit", data, rows, records, epochs)
    loop, loop_error = run_side(f"tf.function loop deepfm {rows} rows", run_child,
                                "bench.deepfm", "loop", data, rows, records, epochs)
    for ps in ps_counts:
        config = {"rows": rows, "dim": 16, "batch": BATCH, "workers": WORKERS, "ps": ps,
                  "records": records, "vocab_per_field": VOCAB_SIZE, "optimizer": optimizer}
        ours, error = run_side(f"elastic_keras deepfm {rows} rows {ps} ps", run_child,
                               "bench.deepfm", "elastic", data, rows, ps, epochs)
        peer, peer_error = run_side(f"pss deepfm {rows} rows {ps} ps", pss.train, "deepfm",
                                    files, BATCH, steps, WORKERS, ps, rows)
        rss = ours and ours["rss"]
        emit("sparse/deepfm", {**config, "epochs": epochs, "peer_processes": 1,
                               "peer_peak_rss_mb": fit and round(fit["rss"], 1),
                               "seconds": side_times(elastic_keras=ours, keras_fit=fit)},
             ours and ours["value"], "examples/s", rss, peer="keras_fit",
             peer_value=fit and fit["value"], error=errors(error, fit_error))
        emit("sparse/deepfm", {**config, "epochs": epochs, "peer_processes": 1,
                               "peer_peak_rss_mb": loop and round(loop["rss"], 1),
                               "seconds": side_times(elastic_keras=ours, tf_function_loop=loop)},
             ours and ours["value"], "examples/s", rss, peer="tf_function_loop",
             peer_value=loop and loop["value"], error=errors(error, loop_error))
        if epochs > 1:
            emit("sparse/deepfm/steady", {**config, "epochs": epochs,
                                          "window": "epochs after the first"},
                 ours and ours["steady"], "examples/s", rss, peer="keras_fit",
                 peer_value=fit and fit["steady"], error=errors(error, fit_error))
        emit("sparse/deepfm",
             {**config, "epochs": 1, "peer_chief": 1, "peer_steps": steps,
              "peer_steps_per_execution": peer and peer["steps_per_execution"],
              "peer_peak_rss_mb": peer and peer["rss"],
              "seconds": side_times(elastic_keras=ours, pss=peer)},
             ours and ours["first_epoch"], "examples/s", rss, peer="pss",
             peer_value=peer and peer["value"], error=errors(error, peer_error))


def run(quick, work_dir):
    if quick:
        plan = [(1_000_000, QUICK_RECORDS, [1], 2)]
    else:
        plan = [(1_000_000, FULL_RECORDS, [1, 2], 2),
                (10_000_000, LARGE_TABLE_RECORDS, [1, 2], 1)]
    for rows, records, ps_counts, epochs in plan:
        data, error = attempt("generating click records", click_records, work_dir, records)
        if error:
            emit("sparse/deepfm", {"rows": rows}, None, "examples/s", None, error=error)
            continue
        for optimizer in OPTIMIZERS:
            compare(data, rows, records, ps_counts, epochs, optimizer)


def census():
    """`sparse/census_job`: the census wide & deep zoo job on the real Adult data (2 workers,
    2 PS), examples/s and held-out accuracy (`python -m bench census`)."""
    if not (SHARED_DATA / "adult.csv.gz").exists():
        emit("sparse/census_job", {}, None, "examples/s", None,
             error=f"needs {SHARED_DATA / 'adult.csv.gz'}")
        return
    result, error = attempt("census job", run_child, "bench.deepfm", "census", 2)
    emit("sparse/census_job",
         {"workers": 2, "ps": 2, "minibatch": 128, "epochs": 2, "records_per_epoch": 39073,
          "held_out_accuracy": result and round(result["accuracy"], 4)},
         result and result["value"], "examples/s", result and result["rss"], error=error)


def main():
    side, *args = sys.argv[1:]
    if side in ("fit", "loop"):  # DATA ROWS RECORDS EPOCHS
        (fit_side if side == "fit" else loop_side)(pathlib.Path(args[0]), *map(int, args[1:]))
    elif side == "elastic":  # DATA ROWS PS EPOCHS [WORKERS [TLS]]
        elastic_side(pathlib.Path(args[0]), *map(int, args[1:5]), *args[5:6])
    elif side == "census":
        census_side(int(args[0]))
    else:
        raise SystemExit(f"usage: python -m bench.deepfm {{fit,loop,elastic,census}} ...; "
                         f"got {side!r}")


if __name__ == "__main__":
    main()
