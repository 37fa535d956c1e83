"""The module's callbacks in a real MNIST job (2 workers, 1 PS, local processes): a
LearningRateScheduler sets the parameter servers' rate each epoch (read back from them by a
user callback, and from the final checkpoint), EarlyStopping on val_accuracy ends a 4-epoch
job after its second epoch (succeeded, stopped_early), ModelCheckpoint keeps the best model,
a TensorBoard callback's log_dir gets the job's events, and the user callback receives every
hook with fit's logs. Run again, the finished job stays stopped early."""

import json

import keras
import numpy as np
import pytest

from elastic_keras.common.checkpoint_layout import latest_complete
from elastic_keras.ps.checkpoint import load_shards
from tests.conftest import ROOT
from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow

MODULE = """
import json
import os

import keras
from model_zoo.mnist.mnist_functional import custom_model, dataset_fn, eval_metrics_fn, loss


def optimizer():
    return keras.optimizers.Adam(0.001)


class Record(keras.callbacks.Callback):
    def _write(self, event, **fields):
        with open(os.environ["CALLBACK_LOG"], "a") as f:
            f.write(json.dumps({"event": event, **fields}) + "\\n")

    def on_train_begin(self, logs=None):
        self._write("train_begin")

    def on_epoch_begin(self, epoch, logs=None):
        self._write("epoch_begin", epoch=epoch, rate=float(self.model.optimizer.learning_rate))

    def on_epoch_end(self, epoch, logs=None):
        self._write("epoch_end", epoch=epoch, logs=logs)

    def on_train_end(self, logs=None):
        self._write("train_end")


def callbacks():
    out = os.environ["CALLBACK_OUT"]
    return [
        keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.002 * 0.5 ** epoch),
        keras.callbacks.EarlyStopping(monitor="val_accuracy", min_delta=1.0, patience=0),
        keras.callbacks.ModelCheckpoint(os.path.join(out, "best.keras"),
                                        monitor="val_accuracy", save_best_only=True),
        keras.callbacks.TensorBoard(log_dir=os.path.join(out, "tb")),
        Record(),
    ]
"""


def test_callbacks_drive_the_rate_stop_early_and_keep_the_best_model(mnist_records, tmp_path):
    module = tmp_path / "mnist_callbacks.py"
    module.write_text(MODULE)
    log = tmp_path / "callbacks.jsonl"
    job = ("train", "--model-zoo", ROOT, "--model-def", module,
           "--training-data", mnist_records / "train", "--validation-data", mnist_records / "test",
           "--num-workers", "2", "--minibatch-size", "64", "--num-epochs", "4",
           "--checkpoint-dir", tmp_path / "ckpt", "--output", tmp_path / "out",
           "--job-name", "callbacks-e2e")
    env = {"PYTHONPATH": str(ROOT), "CALLBACK_LOG": str(log), "CALLBACK_OUT": str(tmp_path)}
    result = run_cli(*job, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["event"] for e in events] == ["train_begin", "epoch_begin", "epoch_end",
                                            "epoch_begin", "epoch_end", "train_end"]
    # What the parameter servers answered once the scheduler had set the epoch's rate.
    assert [e["rate"] for e in events if e["event"] == "epoch_begin"] == pytest.approx(
        [0.002, 0.001])
    first, second = (e["logs"] for e in events if e["event"] == "epoch_end")
    assert set(first) == set(second) == {"loss", "val_accuracy", "learning_rate"}
    assert first["learning_rate"] == pytest.approx(0.002) and 0 < first["loss"] < 3
    summary = json.loads((tmp_path / "out" / "job_summary.json").read_text())
    assert (summary["status"], summary["stopped_early"]) == ("succeeded", 2)
    assert [e["trained_never"] for e in summary["epochs"]] == [0, 0]
    assert [e["metrics"]["accuracy"] for e in summary["evaluations"]] == pytest.approx(
        [first["val_accuracy"], second["val_accuracy"]])
    path, _ = latest_complete(str(tmp_path / "ckpt"))
    rate = json.loads(load_shards(path, 0, 1).optimizer_config)["config"]["learning_rate"]
    assert rate == pytest.approx(0.001)
    best = keras.models.load_model(tmp_path / "best.keras")  # epoch 1's: the only improvement
    assert best.predict(np.zeros((2, 28, 28, 1), np.float32), verbose=0).shape == (2, 10)
    assert list((tmp_path / "tb").iterdir())
    assert not (tmp_path / "out" / "tensorboard").exists()
    assert "stopped early after epoch 2" in result.stderr
    # Run again, it resumes the finished job: still stopped after epoch 2, nothing trained.
    again = run_cli(*job, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    summary = json.loads((tmp_path / "out" / "job_summary.json").read_text())
    assert (summary["status"], summary["stopped_early"]) == ("succeeded", 2)
    assert len(summary["epochs"]) == 2 and summary["evaluations"][-1]["model_version"] == (
        summary["final_model_version"])
