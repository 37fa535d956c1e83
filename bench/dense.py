"""Dense models: elastic_keras (W workers + 1 PS) against plain Keras `fit` and against
TensorFlow's ParameterServerStrategy (W workers + 1 PS + its chief).

Models: the MNIST CNN (`model_zoo/mnist/mnist_functional.py`, 1.2M parameters) and an MLP
(`bench/models/mnist_mlp.py`, 0.5M parameters), on 4,000 MNIST training records, Adam
(learning rate 0.001), batch 64 and 512, 1 and 2 workers. Every side trains the same
architecture on the same records, batch and optimizer, and counts examples/s from its first
step (tracing included) to its last, not process start-up:

- `elastic_keras`: a job (`elastic_keras.train`, asynchronous, default transfer settings,
  no export); the job summary's examples/s;
- `keras_fit`: `model.fit` of the same Keras 3 module in one process;
- `pss`: `bench.pss` (tf_keras rebuild of the architecture, steps of `batch` records,
  about as many examples as the others: a multiple of 10 steps when there are 10 or more);
- `limit` (`bench.dense_limit`, line `dense/MODEL/limit`): the same training in one process
  by a `tf.function` step, plus raw gRPC moving a step's parameter bytes both ways once per
  step, timed one after the other: what a worker and its PS could reach if the platform cost
  nothing beyond the step and its bytes; `config` holds both parts' seconds.

Each side runs in processes of its own. One line per comparison: `value` is
elastic_keras's, `peer_value` the peer's; `config.peer_peak_rss_mb` the peer's largest
process (PSS: every process); `config.seconds` per side, `wall_s` (everything, process
start-up included) and `measured_s` (the time the figure is over).

Against `fit`, a second line, `dense/MODEL/steady`, counts the epochs after the first only
(elastic_keras: the job summary's per-epoch `training_s`; `fit`: a callback's epoch ends):
the throughput of a long job, once both sides have built and traced their steps. From the
first step, a job's figure also holds the worker's model build, its first pull and push of
the whole model and its tracing (about 2 s for the CNN on 2 cores), which `fit` does before
its first step or not at all; on a few thousand records that weighs a lot.

Passes over the 4,000 records: 2 (the second is the steady-state window). `--quick`: the
MLP at batch 64 with 1 worker, 2 passes, against Keras fit only (on 2 cores the CNN's steps
take about 20 s more per side, and the strategy's cluster about 35 s to start).
"""

import json
import math
import sys
import time

from bench import dense_limit, pss
from bench.common import (
    ROOT, attempt, emit, epoch_seconds, errors, mnist_records, peak_rss_mb, run_child, run_side,
    side_times, steady_rate,
)

# name -> (model zoo, model_def)
MODELS = {
    "mnist_cnn": ("model_zoo", "mnist.mnist_functional"),
    "mnist_mlp": (str(ROOT), "bench.models.mnist_mlp"),
}
RECORDS = 4000
# Passes over the records per model in the full run: the MLP's steps are short, so it gets
# more of them for its figures to rest on more than start-up.
FULL_EPOCHS = {"mnist_cnn": 2, "mnist_mlp": 2}
QUICK_EPOCHS = 2


def minibatches(records, model, batch):
    """(the model's spec, its minibatches of `batch` training records, records per pass)."""
    import tensorflow as tf

    from elastic_keras.common.model_spec import Mode, load_model_spec
    from elastic_keras.data.reader import open_reader
    from elastic_keras.data.shards import list_shards

    spec = load_model_spec(*MODELS[model])
    shards = list_shards(str(records / "train"))
    metadata = open_reader(shards[0].path).metadata
    dataset = spec.minibatches(
        tf.data.TFRecordDataset([s.path for s in shards]), Mode.TRAINING, metadata, batch
    ).prefetch(tf.data.AUTOTUNE)
    return spec, dataset, sum(s.num_records for s in shards)


def fit_side(records, model, batch, epochs):
    """Plain `model.fit` in this process; prints {"value": examples/s, "rss": MB, "steady":
    examples/s of the epochs after the first}."""
    import keras

    spec, dataset, records = minibatches(records, model, batch)
    keras_model = spec.custom_model()
    keras_model.compile(optimizer=spec.optimizer(), loss=spec.loss)
    ends = []
    timer = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: ends.append(time.perf_counter()))
    started = time.perf_counter()
    keras_model.fit(dataset, epochs=epochs, verbose=0, callbacks=[timer])
    elapsed = time.perf_counter() - started
    print(json.dumps({"value": records * epochs / elapsed, "rss": peak_rss_mb(),
                      "measured_s": round(elapsed, 1),
                      "steady": steady_rate(records, epoch_seconds(started, ends))}))


def elastic_side(records, model, batch, epochs, workers, tls="off"):
    """An elastic_keras job (1 PS; `tls` its --tls); prints {"value": examples/s, "rss": MB,
    "steady": examples/s of the epochs after the first, from the job summary's per-epoch
    seconds}."""
    import elastic_keras

    model_zoo, model_def = MODELS[model]
    summary = elastic_keras.train(
        model_zoo=model_zoo, model_def=model_def, training_data=str(records / "train"),
        num_workers=workers, num_ps=1, minibatch_size=batch, num_epochs=epochs,
        log_level="warning", tls=tls,
    )
    if summary.status.value != "succeeded":
        raise SystemExit(f"job failed: {summary.error}")
    records = summary.epochs[0]["records"]
    print(json.dumps({"value": summary.examples_per_second, "rss": peak_rss_mb(),
                      "measured_s": summary.training_time_s,
                      "steady": steady_rate(records, [e["training_s"] for e in summary.epochs])}))


def pss_steps(records, batch):
    """About `records / batch` steps: a multiple of 10 from 10 up."""
    steps = records / batch
    return math.ceil(steps) if steps < 10 else max(10, round(steps / 10) * 10)


def run(quick, work_dir):
    records, error = attempt("preparing MNIST records", mnist_records, work_dir)
    if error:
        emit("dense/records", {}, None, "examples/s", None, error=error)
        return
    if quick:
        plan = [("mnist_mlp", 64, QUICK_EPOCHS, [1])]
    else:
        plan = [(m, b, FULL_EPOCHS[m], [1, 2]) for m in MODELS for b in (64, 512)]
    files = sorted((records / "train").glob("*.tfrecord"))
    for model, batch, epochs, worker_counts in plan:
        fit, fit_error = run_side(f"keras fit {model}", run_child, "bench.dense", "fit",
                                  records, model, batch, epochs)
        limit, limit_error = run_side(f"limit {model}", run_child, "bench.dense", "limit",
                                      records, model, batch, epochs)
        for workers in worker_counts:
            config = {"model": model, "batch": batch, "workers": workers, "ps": 1,
                      "epochs": epochs, "records_per_epoch": RECORDS}
            ours, error = run_side(f"elastic_keras {model}", run_child, "bench.dense",
                                   "elastic", records, model, batch, epochs, workers)
            steps = pss_steps(RECORDS * epochs, batch)
            value, rss = (ours["value"], ours["rss"]) if ours else (None, None)
            emit(f"dense/{model}",
                 {**config, "peer_peak_rss_mb": fit and round(fit["rss"], 1),
                  "seconds": side_times(elastic_keras=ours, keras_fit=fit)},
                 value, "examples/s", rss, peer="keras_fit", peer_value=fit and fit["value"],
                 error=errors(error, fit_error))
            emit(f"dense/{model}/steady", {**config, "window": "epochs after the first"},
                 ours and ours["steady"], "examples/s", rss, peer="keras_fit",
                 peer_value=fit and fit["steady"], error=errors(error, fit_error))
            emit(f"dense/{model}/limit",
                 {**config, "seconds": side_times(elastic_keras=ours, limit=limit),
                  **{key: limit and limit[key]
                     for key in ("compute_s", "wire_s", "steps", "bytes_each_way")}},
                 value, "examples/s", rss, peer="limit", peer_value=limit and limit["value"],
                 error=errors(error, limit_error))
            if quick:
                continue
            peer, peer_error = run_side(f"pss {model}", pss.train, model, files, batch, steps,
                                        workers, 1)
            emit(f"dense/{model}",
                 {**config, "peer_steps": steps, "peer_chief": 1,
                  "peer_steps_per_execution": peer and peer["steps_per_execution"],
                  "peer_peak_rss_mb": peer and peer["rss"],
                  "seconds": side_times(elastic_keras=ours, pss=peer)},
                 value, "examples/s", rss, peer="pss", peer_value=peer and peer["value"],
                 error=errors(error, peer_error))


if __name__ == "__main__":
    import pathlib

    side, records, model, batch, epochs = sys.argv[1:6]
    records = pathlib.Path(records)
    if side == "fit":
        fit_side(records, model, int(batch), int(epochs))
    elif side == "limit":
        dense_limit.limit_side(*minibatches(records, model, int(batch)), int(epochs))
    else:
        elastic_side(records, model, int(batch), int(epochs), int(sys.argv[6]), *sys.argv[7:8])
