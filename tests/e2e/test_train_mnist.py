"""End to end: `elastic-keras train` with 2 workers and 1 PS on real MNIST, as a user runs it."""

import json

import numpy as np
import pytest
import tensorflow as tf

from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow


def _held_out(records_dir):
    dataset = tf.data.TFRecordDataset(sorted(str(p) for p in records_dir.glob("*.tfrecord")))
    spec = {"image": tf.io.FixedLenFeature([784], tf.int64),
            "label": tf.io.FixedLenFeature([1], tf.int64)}
    parsed = [tf.io.parse_single_example(r, spec) for r in dataset]
    images = np.stack([p["image"].numpy() for p in parsed]).astype(np.float32) / 255.0
    labels = np.concatenate([p["label"].numpy() for p in parsed])
    return images.reshape(-1, 28, 28, 1), labels


def test_mnist_two_workers_one_ps(mnist_records, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-zoo", "model_zoo", "--model-def", "mnist.mnist_functional",
        "--training-data", mnist_records / "train", "--validation-data", mnist_records / "test",
        "--num-workers", 2, "--num-ps", 1, "--minibatch-size", 64, "--num-epochs", 3,
        "--output", out, "--job-name", "mnist-e2e",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Job mnist-e2e SUCCEEDED" in result.stderr

    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded"
    assert [e["records"] for e in summary["epochs"]] == [4000] * 3
    assert all(e["trained_at_least_once"] == 4000 and e["trained_never"] == 0
               for e in summary["epochs"])
    assert summary["tasks_failed"] == 0
    assert summary["final_model_version"] >= 3 * 4000 // 64
    assert summary["examples_per_second"] > 0
    assert len(summary["evaluations"]) == 3
    assert summary["evaluations"][-1]["metrics"]["accuracy"] >= 0.90

    # The export serves without this package: plain tf.saved_model.load.
    loaded = tf.saved_model.load(str(out / "saved_model"))
    images, labels = _held_out(mnist_records / "test")
    assert len(labels) == 1000
    logits = loaded.serve(tf.constant(images)).numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == labels))
    assert accuracy >= 0.90
    assert abs(accuracy - summary["evaluations"][-1]["metrics"]["accuracy"]) < 1e-6
    assert (out / "logs" / "worker-0.log").exists() and (out / "logs" / "ps-0.log").exists()
