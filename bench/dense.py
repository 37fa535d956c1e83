"""Dense models: elastic_keras (W workers + 1 PS) against plain Keras `model.fit`.

Both sides train the same model-zoo module on the same records with the same batch size and
optimizer, and both count the time from the first step (tracing included) to the last, not
process start-up. Each side runs in its own process so its peak RSS is its own.
"""

import json
import sys
import tempfile
import time

from bench.common import emit, mnist_records, peak_rss_mb, run_child

MODELS = {"mnist_cnn": "mnist.mnist_functional"}


def fit_side(records, model_def, batch, epochs):
    """Plain `model.fit` in this process; prints {"value": examples/s, "rss": MB}."""
    import tensorflow as tf

    from elastic_keras.common.model_spec import Mode, load_model_spec
    from elastic_keras.data.shards import list_shards
    from elastic_keras.data.reader import open_reader

    spec = load_model_spec("model_zoo", model_def)
    shards = list_shards(str(records / "train"))
    metadata = open_reader(shards[0].path).metadata
    dataset = spec.dataset_fn(
        tf.data.TFRecordDataset([s.path for s in shards]), Mode.TRAINING, metadata
    ).batch(batch).prefetch(tf.data.AUTOTUNE)
    model = spec.custom_model()
    model.compile(optimizer=spec.optimizer(), loss=spec.loss)
    total = sum(s.num_records for s in shards) * epochs
    started = time.perf_counter()
    model.fit(dataset, epochs=epochs, verbose=0)
    elapsed = time.perf_counter() - started
    print(json.dumps({"value": total / elapsed, "rss": peak_rss_mb()}))


def elastic_side(records, model_def, batch, epochs, workers):
    """An elastic_keras job; prints {"value": examples/s, "rss": MB}."""
    with tempfile.TemporaryDirectory() as out:
        import elastic_keras

        summary = elastic_keras.train(
            model_zoo="model_zoo", model_def=model_def, training_data=str(records / "train"),
            num_workers=workers, num_ps=1, minibatch_size=batch, num_epochs=epochs,
            output=out, log_level="warning",
        )
        if summary.status.value != "succeeded":
            raise SystemExit(f"job failed: {summary.error}")
        print(json.dumps({"value": summary.examples_per_second, "rss": peak_rss_mb()}))


def run(quick, work_dir):
    records = mnist_records(work_dir)
    epochs = 1 if quick else 3
    batches = [64] if quick else [64, 512]
    for model_name, model_def in MODELS.items():
        for batch in batches:
            fit = run_child("bench.dense", "fit", records, model_def, batch, epochs)
            for workers in (1, 2):
                ours = run_child("bench.dense", "elastic", records, model_def, batch, epochs,
                                 workers)
                emit(f"dense/{model_name}",
                     {"batch": batch, "workers": workers, "ps": 1, "epochs": epochs,
                      "records_per_epoch": 4000},
                     ours["value"], "examples/s", ours["rss"], peer="keras_fit",
                     peer_value=fit["value"])


if __name__ == "__main__":
    import pathlib

    side, records, model_def, batch, epochs = sys.argv[1:6]
    records = pathlib.Path(records)
    if side == "fit":
        fit_side(records, model_def, int(batch), int(epochs))
    else:
        elastic_side(records, model_def, int(batch), int(epochs), int(sys.argv[6]))
