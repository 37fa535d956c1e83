"""What the master makes of a worker's fatal failures and skipped minibatches, over real gRPC
on loopback with the `MasterClient` workers use (a real `Master`, not run)."""

import io
import logging
import time

import pytest

from elastic_keras.common import rpc
from elastic_keras.common.config import JobConfig
from elastic_keras.common.errors import ModelSpecError
from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.master.console import Console
from elastic_keras.master.instance_manager import LocalInstanceManager
from elastic_keras.master.master import Master
from elastic_keras.master.summary import JobStatus
from elastic_keras.master.task_manager import TaskManager
from tests.conftest import ROOT
from tests.master.test_master_servicer import client  # noqa: F401 - on this file's master

NAN = ("NonFiniteLossError: The training loss is nan in minibatch 3 (records [44, 48) of "
       "train-0.tfrecord) of task 2 on worker 0")


@pytest.fixture
def master():
    config = JobConfig(model_def="digits.digits_cnn", training_data="unused",
                       max_task_retries=3, job_name="health-test")
    spec = load_model_spec(str(ROOT / "model_zoo"), "digits.digits_cnn")
    master = Master(config, spec, engine=LocalInstanceManager(),
                    console=Console(stream=io.StringIO()))
    master.reports.tasks = TaskManager([("train-0.tfrecord", 80)], records_per_task=40,
                                       num_epochs=1, max_task_retries=3, seed=0)
    return master


def test_a_fatal_failure_fails_the_job_at_once_without_a_retry(client, master):
    task = client.get_task(0)
    client.report_task_result(0, task.task_id, records_done=4, error=NAN,
                              fatal="non_finite_loss")
    assert master.tasks.failed and master.tasks.finished
    assert (master.tasks.tasks_failed, master.tasks.tasks_requeued) == (1, 0)
    assert master.tasks.error == (f"training task on train-0.tfrecord records [{task.start}, "
                                  f"{task.end}) failed: {NAN}")
    summary = master._summary(time.time())
    assert summary.status == JobStatus.FAILED and summary.error == master.tasks.error
    master.reports.raise_for_bad_module(summary.error)  # a NaN is no module error


def test_an_ordinary_failure_is_still_retried(client, master):
    task = client.get_task(0)
    client.report_task_result(0, task.task_id, records_done=4, error="ValueError: flaky")
    assert not master.tasks.failed and master.tasks.tasks_requeued == 1


def test_a_module_a_worker_finds_broken_ends_the_job_as_the_module_check_does(client, master):
    task = client.get_task(0)
    error = ("ModelSpecError: Model module 'm': `loss(labels, predictions)` must return a "
             "scalar. Received: a tensor of shape (32,)")
    client.report_task_result(0, task.task_id, records_done=0, error=error,
                              fatal="model_module")
    assert master.tasks.failed and master.tasks.tasks_requeued == 0
    with pytest.raises(ModelSpecError, match=r"must return a scalar\. Received: a tensor"):
        master.reports.raise_for_bad_module(master.tasks.error)


def test_skipped_minibatches_are_counted_per_worker_and_written_in_the_summary(client, master):
    first, second = client.get_task(0), client.get_task(1)
    skipped = {"non_finite_loss": 1}
    client.report_progress(0, first.task_id, 8, 1.0, 1, minibatches=1, skipped=skipped)
    client.report_progress(0, first.task_id, 8, 1.0, 1, minibatches=1, skipped=skipped)  # again
    client.report_task_result(0, first.task_id, 40, loss=1.0, model_version=2, minibatches=8,
                              skipped={"non_finite_loss": 2})
    client.report_task_result(1, second.task_id, 40, loss=1.0, model_version=3, minibatches=9,
                              skipped=skipped)
    assert master.reports.skipped_minibatches() == (
        {"non_finite_loss": 3}, {"0": {"non_finite_loss": 2}, "1": {"non_finite_loss": 1}})
    summary = master._summary(time.time()).to_dict()
    assert summary["status"] == "succeeded"
    assert summary["skipped_minibatches"] == {"non_finite_loss": 3}
    assert summary["pushes"]["skipped_by_worker"] == {"0": {"non_finite_loss": 2},
                                                      "1": {"non_finite_loss": 1}}


def test_train_exits_2_when_a_worker_found_the_module_broken(monkeypatch, master, capsys):
    """`run_job` raises `ModelSpecError` after the job, so `elastic-keras train` exits 2
    as it does for a module the check before launch refuses."""
    from elastic_keras.master import main

    error = "training task on data.csv records [0, 32) failed: ModelSpecError: Model module"
    master.reports.fatal = "model_module"
    master.run = lambda: type("Summary", (), {"error": error})()
    monkeypatch.setattr(main, "Master", lambda *args, **kwargs: master)
    monkeypatch.setattr(main, "setup_logging", lambda level: None)
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))  # run_job replaces them
    argv = ["--model-zoo", str(ROOT / "model_zoo"), "--model-def", "digits.digits_cnn",
            "--training-data", "unused"]
    assert main.main(argv) == 2
    assert capsys.readouterr().err.strip() == f"master: error: {error}"
