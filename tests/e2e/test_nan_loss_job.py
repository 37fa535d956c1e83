"""End to end: a NaN training loss fails the job (`--on-non-finite-loss fail`, the default)
or is skipped and counted (`skip`). One tiny CSV job, run both ways."""

import json
import textwrap
import uuid

import pytest

from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow

MODULE = """
    import keras
    import tensorflow as tf


    def custom_model():
        inputs = keras.Input(shape=(1,), name="x")
        return keras.Model(inputs, keras.layers.Dense(1)(inputs))


    def loss(labels, predictions):
        return tf.reduce_mean(tf.square(predictions - labels))


    def optimizer():
        return keras.optimizers.SGD(learning_rate=0.01)


    def dataset_fn(dataset, mode, metadata):
        def parse(line):
            x, y = tf.io.decode_csv(line, record_defaults=[[0.0], [0.0]])
            return tf.reshape(x, [1]), tf.reshape(y, [1])

        return dataset.map(parse)
"""


def _job(tmp_path, data, policy):
    out = tmp_path / policy
    result = run_cli(
        "train", "--training-data", data, "--model-zoo", tmp_path, "--model-def", "nan_model",
        "--output", out, "--job-name", f"nan-{policy}-{uuid.uuid4().hex[:8]}",
        "--num-workers", 1, "--num-ps", 1, "--minibatch-size", 8,
        "--num-minibatches-per-task", 4, "--on-non-finite-loss", policy, timeout=300)
    return result, json.loads((out / "job_summary.json").read_text())


def test_a_nan_loss_fails_the_job_unless_skipped(tmp_path):
    (tmp_path / "nan_model.py").write_text(textwrap.dedent(MODULE))
    rows = [f"{i / 64},{2 * i / 64}" for i in range(64)]
    rows[21] = "nan,1"  # record 21: minibatch 3 of the task of records [0, 32)
    data = tmp_path / "data.csv"
    data.write_text("x,y\n" + "\n".join(rows) + "\n")

    result, summary = _job(tmp_path, data, "fail")
    assert result.returncode == 1, result.stderr[-5000:]
    assert summary["status"] == "failed"
    assert ("NonFiniteLossError: The training loss is nan in minibatch 3 (records [16, 24) "
            f"of {data}) of task ") in summary["error"]
    assert " on worker 0; nothing of it was pushed" in summary["error"]
    assert "\n" not in summary["error"] and summary["tasks_failed"] == 1

    result, summary = _job(tmp_path, data, "skip")
    assert result.returncode == 0, result.stderr[-5000:]
    assert summary["status"] == "succeeded"
    assert summary["skipped_minibatches"] == {"non_finite_loss": 1}
    assert summary["pushes"]["skipped_by_worker"] == {"0": {"non_finite_loss": 1}}
    assert summary["pushes"]["by_worker"]["0"]["minibatches"] == 7
    assert summary["epochs"][0]["trained_never"] == 0
