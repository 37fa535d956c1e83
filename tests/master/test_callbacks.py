"""Which callbacks a job runs and which it refuses when the module is checked, and what the
master hands them at an epoch's end."""

import textwrap

import keras
import numpy as np
import pytest

from elastic_keras import cli
from elastic_keras.common import config as config_lib
from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.master.callbacks import CallbackError, JobCallbacks
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.throughput import Throughput

MODULE = """
import keras
import numpy as np
from model_zoo.mnist.mnist_functional import custom_model, dataset_fn, loss


def optimizer():
    return keras.optimizers.{optimizer}


def eval_metrics_fn():
    return {{"accuracy": keras.metrics.SparseCategoricalAccuracy(), "mae": lambda y, p: p}}


def callbacks():
    return [{callbacks}]
"""


def _job(tmp_path, callbacks, optimizer="SGD(0.1)", validation=True):
    path = tmp_path / "module.py"
    path.write_text(textwrap.dedent(MODULE.format(callbacks=callbacks, optimizer=optimizer)))
    spec = load_model_spec(str(tmp_path), str(path))
    flags = ["train", "--model-def", str(path), "--training-data", "t"]
    config = config_lib.from_namespace(config_lib.JobConfig, cli.build_parser().parse_args(
        flags + (["--validation-data", "v"] if validation else [])))
    return JobCallbacks(spec, config)


@pytest.mark.parametrize("callbacks, message", [
    ("keras.callbacks.TerminateOnNaN()", "TerminateOnNaN, which a job cannot run: use "
                                         "--on-non-finite-loss fail"),
    ("keras.callbacks.BackupAndRestore('/tmp/b')", "resumes from its --checkpoint-dir"),
    ("keras.callbacks.EarlyStopping(monitor='val_accuracy', restore_best_weights=True)",
     "restore_best_weights=True"),
    ("keras.callbacks.EarlyStopping(monitor='val_auc')",
     "monitors 'val_auc', which this job does not log. Logged: loss, val_accuracy, val_mae"),
    ("keras.callbacks.EarlyStopping(monitor='val_mae')", "pass mode='max' or mode='min'"),
    ("keras.callbacks.ModelCheckpoint('/tmp/m.keras', save_freq=10)", "save_freq=10"),
    ("'not a callback'", "must return keras.callbacks.Callback instances"),
])
def test_callbacks_a_job_cannot_honour_are_refused_by_name(tmp_path, callbacks, message):
    with pytest.raises(ModelSpecError) as raised:
        _job(tmp_path, callbacks)
    assert message in str(raised.value)


def test_a_learning_rate_callback_needs_a_settable_rate(tmp_path):
    with pytest.raises(ModelSpecError, match="has a schedule as its learning rate"):
        _job(tmp_path, "keras.callbacks.ReduceLROnPlateau(monitor='loss')",
             optimizer="SGD(keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.5))")


def test_val_metrics_need_validation_data(tmp_path):
    with pytest.raises(ModelSpecError, match="Logged: loss \\("):
        _job(tmp_path, "keras.callbacks.EarlyStopping(monitor='val_accuracy')",
             validation=False)


def test_auto_mode_follows_the_metrics_direction_and_tensorboard_gives_its_dir(tmp_path):
    job = _job(tmp_path, "keras.callbacks.EarlyStopping(monitor='val_accuracy'), "
                         "keras.callbacks.TensorBoard(log_dir='/tmp/tb-here')")
    assert job._callbacks[0].mode == "max" and job.log_dir == "/tmp/tb-here"
    assert len(job._callbacks) == 1  # TensorBoard's own hooks do not run


class _Recorder(keras.callbacks.Callback):
    def __init__(self, fail=False):
        super().__init__()
        self.seen, self.fail = [], fail

    def on_epoch_end(self, epoch, logs=None):
        if self.fail:
            raise OSError("cannot write")
        self.seen.append((epoch, dict(logs)))
        if epoch == 1:
            self.model.stop_training = True


def test_epoch_end_gets_fits_logs_and_a_stop_ends_the_job_after_that_epoch(tmp_path):
    job = _job(tmp_path, "")
    recorder = _Recorder()
    recorder.set_model(job.model)
    job._callbacks = [recorder]
    tasks, throughput = TaskManager([("a", 4)], 4, 3, 0), Throughput()
    evaluations = [{"epoch": 1, "model_version": 3, "end_of_epoch": True,
                    "metrics": {"accuracy": 0.5}}]
    for epoch, loss in enumerate((2.0, 1.0)):
        task = tasks.get(0)
        tasks.report_result(task.task_id, 4)
        throughput.add(4, loss)
        stopped = job.next_epoch(tasks, throughput, evaluations)
    assert recorder.seen == [(0, {"loss": 2.0, "val_accuracy": 0.5}), (1, {"loss": 1.0})]
    assert stopped == 2 and tasks.finished


def test_a_callback_that_raises_is_named(tmp_path):
    job = _job(tmp_path, "")
    job._callbacks = [_Recorder(fail=True)]
    with pytest.raises(CallbackError, match="_Recorder.on_epoch_end raised OSError: cannot"):
        job.next_epoch(TaskManager([("a", 4)], 4, 1, 0), Throughput(), [])


def test_reduce_lr_on_plateau_halves_a_real_shards_rate_when_the_loss_stalls(tmp_path):
    """ReduceLROnPlateau through the model stand-in, against a shard served on 127.0.0.1."""
    import json

    from elastic_keras.common import rpc
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.ps.parameters import Parameters
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    parameters = Parameters()
    parameters.init_model([("w", np.zeros(2, np.float32))],
                          json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.1))))
    server, port = rpc.create_server([lambda s: add_to_server(PServerServicer(parameters), s)])
    client = PSClient([f"127.0.0.1:{port}"])
    try:
        job = _job(tmp_path, "keras.callbacks.ReduceLROnPlateau(monitor='loss', factor=0.5, "
                             "patience=1, min_delta=0.01)")
        job.begin(client, None, TaskManager([("a", 4)], 4, 4, 0), type("R", (), {})())
        throughput = Throughput()
        tasks = TaskManager([("a", 4)], 4, 4, 0)
        for loss in (1.0, 0.5, 0.5, 0.5):
            task = tasks.get(0)
            tasks.report_result(task.task_id, 4)
            throughput.add(4, loss)
            job.next_epoch(tasks, throughput, [])
        # 0.5 stalls from the third epoch: after patience 1, halved once, then again.
        assert parameters.learning_rate == pytest.approx(0.025)
        assert job.model.optimizer.set_rate == pytest.approx(0.025)
    finally:
        client.close()
        server.stop(0)


def _master_at_an_epochs_end(tmp_path):
    """A master with a recording callback, its epoch 0 of 2 trained, its one shard down."""
    import io

    from elastic_keras.master.console import Console
    from elastic_keras.master.instance_manager import LocalInstanceManager
    from elastic_keras.master.master import Master

    job = _job(tmp_path, "")
    master = Master(job.model._config, job.model._spec, engine=LocalInstanceManager(),
                    console=Console(stream=io.StringIO()))
    recorder = _Recorder()
    recorder.set_model(master.callbacks.model)
    master.callbacks._callbacks = [recorder]
    master.reports.tasks = TaskManager([("a", 4)], 4, 2, 0)
    task = master.tasks.get(0)
    master.tasks.report_result(task.task_id, 4)
    master._epoch_ended = master._rounds(master.tasks)
    assert master._epoch_ended  # trained, and no validation round to wait for
    master.membership.register_ps(0, "127.0.0.1:1")
    master.membership.ps_exited(0)  # down: its replacement has not registered yet
    return master, recorder


def test_an_ended_epochs_callbacks_wait_for_a_shard_down_to_answer_again(tmp_path):
    """Callbacks may call the shards: with one being relaunched, the master's loop holds the
    epoch's end (no task of the next epoch goes out) until every shard answers."""
    master, recorder = _master_at_an_epochs_end(tmp_path)
    master._close_epoch()
    assert recorder.seen == [] and master.tasks.epoch == 0 and master.tasks.get(0) is None
    master.membership.register_ps(0, "127.0.0.1:2")
    master._close_epoch()
    assert [epoch for epoch, _ in recorder.seen] == [0] and master.tasks.epoch == 1
    assert master._error == ""


def test_callbacks_waiting_too_long_for_a_shard_fail_the_job(tmp_path, monkeypatch):
    from elastic_keras.master import master as master_module

    master, recorder = _master_at_an_epochs_end(tmp_path)
    master._close_epoch()
    monkeypatch.setattr(master_module, "PS_REGISTRATION_TIMEOUT_S", -1.0)
    master._close_epoch()
    assert "did not all answer within -1 s for the epoch's callbacks" in master._error
    assert recorder.seen == []
