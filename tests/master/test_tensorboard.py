import logging

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from elastic_keras.master.tensorboard import EventWriter


def read_scalars(logdir):
    """`{tag: [(step, value)]}` of the scalars in the event files of `logdir`."""
    events = EventAccumulator(str(logdir))
    events.Reload()
    return {
        tag: [(e.step, float(tf.make_ndarray(e.tensor_proto))) for e in events.Tensors(tag)]
        for tag in events.Tags()["tensors"]
    }


def test_scalars_are_read_back_with_their_steps(tmp_path):
    writer = EventWriter(tmp_path / "tensorboard")
    writer.scalar("train/loss", 2.5, step=10)
    writer.scalars({"train/loss": 1.25, "train/examples_per_second": 300.0}, step=20)
    writer.scalars({"eval/accuracy": 0.75, "eval/auc": 0.5}, step=20)
    writer.flush()
    assert read_scalars(tmp_path / "tensorboard") == {
        "train/loss": [(10, 2.5), (20, 1.25)],
        "train/examples_per_second": [(20, 300.0)],
        "eval/accuracy": [(20, 0.75)],
        "eval/auc": [(20, 0.5)],
    }
    writer.close()
    writer.scalar("train/loss", 9.0, step=30)  # closed: a no-op
    writer.close()
    assert read_scalars(tmp_path / "tensorboard")["train/loss"][-1] == (20, 1.25)


def test_an_unwritable_logdir_warns_once_and_writes_nothing(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with caplog.at_level(logging.WARNING, logger="elastic_keras.master.tensorboard"):
        writer = EventWriter(blocker / "tensorboard")
        writer.scalar("train/loss", 1.0, step=1)
        writer.scalars({"eval/accuracy": 1.0}, step=1)
        writer.flush()
        writer.close()
    assert not writer.enabled
    [record] = caplog.records
    assert str(blocker / "tensorboard") in record.getMessage()


def test_a_failing_write_disables_the_writer(tmp_path, caplog, monkeypatch):
    writer = EventWriter(tmp_path)

    def broken(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "disk full")

    monkeypatch.setattr(tf.summary, "scalar", broken)
    with caplog.at_level(logging.WARNING, logger="elastic_keras.master.tensorboard"):
        writer.scalar("train/loss", 1.0, step=1)
        writer.scalar("train/loss", 1.0, step=2)
    assert not writer.enabled
    [record] = caplog.records
    assert "disk full" in record.getMessage()


@pytest.mark.parametrize("value", [float("nan"), 3])
def test_any_number_is_written_as_a_float(tmp_path, value):
    writer = EventWriter(tmp_path)
    writer.scalar("train/loss", value, step=1)
    writer.close()
    [(step, read)] = read_scalars(tmp_path)["train/loss"]
    assert step == 1 and (read == value or (read != read and value != value))
