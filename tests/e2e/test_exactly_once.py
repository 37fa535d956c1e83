"""End to end: every minibatch applied exactly once on every shard, and non-trainable state
updated by every minibatch (ARCHITECTURE decision 11)."""

import json

import pytest
import tensorflow as tf

from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow

BATCH = 32


def _minibatches_per_epoch(records_dir):
    """Minibatches in one pass: tasks never span files, so each file ends in a short one."""
    files = sorted((records_dir / "train").glob("*.tfrecord"))
    assert files
    return sum(-(-sum(1 for _ in tf.data.TFRecordDataset(str(f))) // BATCH) for f in files)


def _assert_each_push_applied_once(summary):
    """On every shard, each worker's applied pushes are its minibatches less its drops."""
    by_worker = summary["pushes"]["by_worker"]
    applied = summary["pushes"]["applied_by_shard"]
    assert sorted(applied) == [f"ps-{i}" for i in range(summary["num_ps"])]
    for shard, counts in applied.items():
        assert set(counts) == set(by_worker), (shard, counts, by_worker)
        for worker, entry in by_worker.items():
            dropped = sum(entry["dropped"].get(shard, {}).values())
            assert counts[worker] == entry["minibatches"] - dropped, (shard, worker, summary)


def test_sync_with_more_workers_than_a_round_applies_each_minibatch_once(digits_records,
                                                                          tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-zoo", "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train",
        "--num-workers", 3, "--num-ps", 2, "--minibatch-size", BATCH, "--num-epochs", 2,
        "--grads-to-wait", 2, "--output", out, "--job-name", "sync-once",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    _assert_each_push_applied_once(summary)
    trained = sum(e["minibatches"] for e in summary["pushes"]["by_worker"].values())
    assert trained == 2 * _minibatches_per_epoch(digits_records)
    assert len(summary["pushes"]["by_worker"]) == 3
    # A third worker's push often finds its round closed: it is resent to that shard alone.
    assert sum(s["rejected_as_stale"] for s in summary["staleness"].values()) > 0


COUNTER_MODULE = '''
import keras
import tensorflow as tf
from model_zoo.digits.digits_cnn import dataset_fn, eval_metrics_fn, loss, optimizer


class Counter(keras.layers.Layer):
    """Counts the training minibatches it sees in a non-trainable int64 variable."""

    def build(self, input_shape):
        self.count = self.add_weight(shape=(), initializer="zeros", dtype="int64",
                                     trainable=False, name="count")

    def call(self, inputs, training=None):
        if training:
            self.count.assign_add(1)
        return inputs


def custom_model():
    inputs = keras.Input(shape=(8, 8, 1), name="image")
    x = Counter(name="counter")(inputs)
    x = keras.layers.Flatten()(x)
    x = keras.layers.BatchNormalization()(x)
    outputs = keras.layers.Dense(10, name="logits")(x)
    return keras.Model(inputs, outputs)
'''


def test_a_counter_counts_every_minibatch_of_two_overlapping_workers_on_two_shards(
        digits_records, tmp_path):
    module = tmp_path / "counted.py"
    module.write_text(COUNTER_MODULE)
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-def", module, "--training-data", digits_records / "train",
        "--num-workers", 2, "--num-ps", 2, "--minibatch-size", BATCH, "--num-epochs", 2,
        "--output", out, "--job-name", "counter",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    _assert_each_push_applied_once(summary)
    loaded = tf.saved_model.load(str(out / "saved_model"))
    (count,) = [v for v in loaded.variables if "count" in v.name]
    assert int(count.numpy()) == 2 * _minibatches_per_epoch(digits_records)


def test_every_shard_file_of_a_checkpoint_holds_the_same_minibatches(digits_records,
                                                                     tmp_path):
    from elastic_keras.common.checkpoint_layout import list_checkpoints
    from elastic_keras.ps.checkpoint import load_shards

    out, checkpoints = tmp_path / "out", tmp_path / "ckpt"
    result = run_cli(
        "train", "--model-zoo", "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train",
        "--num-workers", 2, "--num-ps", 2, "--minibatch-size", BATCH, "--num-epochs", 1,
        "--checkpoint-dir", checkpoints, "--checkpoint-steps", 5, "--keep-checkpoint-max", 0,
        "--output", out, "--job-name", "cut",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Checkpoint failed" not in result.stderr  # every cut was reached
    taken = [path for _, path in list_checkpoints(str(checkpoints))]
    assert len(taken) >= 2  # during training, and at its end
    for path in taken:
        shards = [load_shards(path, i, 2) for i in range(2)]
        # Taken while both workers pushed: the same minibatches of each worker on each shard.
        assert shards[0].applied_sequences == shards[1].applied_sequences, path
        assert shards[0].applied_pushes == shards[1].applied_pushes, path
