"""The master's service over real gRPC on loopback (master/servicer.py, master/master.py).

A real `Master` (not run: nothing is launched) with a real `TaskManager` is served by
`MasterServicer` and driven with the `MasterClient` that workers and PS use.
"""

import io

import keras
import numpy as np
import pytest

from elastic_keras.common import rpc
from elastic_keras.common.config import JobConfig
from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.metrics import build_metrics, to_states
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.master.console import Console
from elastic_keras.master.instance_manager import LocalInstanceManager
from elastic_keras.master.master import Master
from elastic_keras.master.servicer import MasterServicer
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.proto import master_pb2, master_pb2_grpc
from tests.conftest import ROOT

TRAIN = [("train-0.tfrecord", 100), ("train-1.tfrecord", 30)]  # tasks of 40 records: 3 + 1
EVAL = [("test-0.tfrecord", 50)]                                  # 2 evaluation tasks


@pytest.fixture(scope="module")
def spec():
    return load_model_spec(str(ROOT / "model_zoo"), "digits.digits_cnn")


@pytest.fixture
def master(spec, tmp_path):
    config = JobConfig(model_def="digits.digits_cnn", training_data="unused", num_ps=2,
                       max_task_retries=1, job_name="servicer-test")
    master = Master(config, spec, engine=LocalInstanceManager(),
                    console=Console(stream=io.StringIO()))
    master.reports.tasks = TaskManager(TRAIN, records_per_task=40, num_epochs=1,
                               max_task_retries=config.max_task_retries, eval_shards=EVAL,
                               seed=0)
    return master


@pytest.fixture
def client(master):
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(master), s)]
    )
    client = MasterClient(f"127.0.0.1:{port}", deadline_s=10.0)
    yield client
    client.close()
    server.stop(grace=None)


def _take_all(client, worker_id):
    """Hands out every task there is, one to each of workers `worker_id`, `worker_id` + 1,
    ... (a worker holds one task at a time); returns them and the answer after."""
    tasks = []
    while True:
        task = client.get_task(worker_id + len(tasks))
        if task.type != master_pb2.TASK_TRAINING:
            return tasks, task
        tasks.append(task)


def _holder(master, task):
    return master.tasks.holder(task.task_id)


def test_cluster_is_ready_only_once_every_ps_registered(client):
    assert client.get_cluster(worker_id=0) == (False, [])
    client.register_ps(1, "127.0.0.1:2001")
    assert client.get_cluster(worker_id=0) == (False, [])
    client.register_ps(0, "127.0.0.1:2000")
    assert client.get_cluster(worker_id=0) == (True, ["127.0.0.1:2000", "127.0.0.1:2001"])
    client.register_ps(0, "127.0.0.1:2002")  # a restarted shard registers its new address
    assert client.get_cluster(worker_id=1) == (True, ["127.0.0.1:2002", "127.0.0.1:2001"])


def test_training_tasks_then_wait_while_they_run_then_none(client, master):
    client.register_worker(0)
    tasks, after = _take_all(client, worker_id=0)
    assert after.type == master_pb2.TASK_WAIT
    assert sorted((t.path, t.start, t.end) for t in tasks) == [
        ("train-0.tfrecord", 0, 40), ("train-0.tfrecord", 40, 80),
        ("train-0.tfrecord", 80, 100), ("train-1.tfrecord", 0, 30),
    ]
    assert len({t.task_id for t in tasks}) == 4
    assert all(t.epoch == 0 for t in tasks)
    assert set(master.tasks.running_tasks()) == {t.task_id for t in tasks}

    master.reports.no_more_tasks = True
    assert client.get_task(0).type == master_pb2.TASK_NONE


def test_progress_and_results_update_the_task_manager(client, master):
    tasks, _ = _take_all(client, worker_id=3)
    first, *others = tasks

    client.report_progress(3, first.task_id, records_done=16, loss=2.5, model_version=4)
    assert master.tasks.records_done(first.task_id) == 16
    assert master.tasks.progress() == (0, 16, 130)
    assert master.reports.throughput.records == 16 and master.reports.throughput.loss == 2.5
    assert master.model_version == 4

    for worker_id, task in enumerate(tasks, start=3):
        client.report_task_result(worker_id, task.task_id, records_done=task.end - task.start,
                                  loss=1.0, model_version=9)
    assert master.tasks.tasks_done == 4 and master.tasks.tasks_failed == 0
    assert master.tasks.progress() == (0, 130, 130)
    assert master.reports.throughput.records == 130
    assert master.model_version == 9
    assert master.tasks.epoch_finished() == 0
    [counts] = master.tasks.epoch_counts()
    assert (counts.trained_at_least_once, counts.trained_more_than_once) == (130, 0)

    # A repeated result (a retried call) changes nothing.
    client.report_task_result(3, first.task_id, records_done=0, error="late duplicate")
    assert (master.tasks.tasks_done, master.tasks.tasks_failed) == (4, 0)


def test_a_failed_task_is_requeued_from_its_progress_then_fails_the_job(client, master):
    tasks, _ = _take_all(client, worker_id=0)
    failing = next(t for t in tasks if (t.path, t.start) == ("train-0.tfrecord", 40))
    worker_id = _holder(master, failing)
    client.report_progress(worker_id, failing.task_id, records_done=10, loss=1.0,
                           model_version=1)
    client.report_task_result(worker_id, failing.task_id, records_done=10,
                              error="ValueError: bad record")
    assert (master.tasks.tasks_failed, master.tasks.tasks_requeued) == (1, 1)
    assert not master.tasks.failed

    retry = client.get_task(worker_id=9)  # another worker takes it over
    assert retry.type == master_pb2.TASK_TRAINING
    assert (retry.path, retry.start, retry.end) == ("train-0.tfrecord", 50, 80)
    assert retry.task_id != failing.task_id

    client.report_task_result(9, retry.task_id, records_done=0,
                              error="ValueError: bad record again")
    assert master.tasks.failed and master.tasks.finished
    assert master.tasks.tasks_failed == 2
    assert "train-0.tfrecord records [50, 80)" in master.tasks.error
    assert "failed 2 times" in master.tasks.error
    assert "ValueError: bad record again" in master.tasks.error
    assert client.get_task(10).type == master_pb2.TASK_WAIT


def test_tasks_of_a_lost_worker_go_to_the_others(client, master):
    tasks, _ = _take_all(client, worker_id=5)
    client.report_progress(5, tasks[0].task_id, records_done=8, loss=1.0, model_version=1)
    assert [master.tasks.recover_worker(w) for w in range(5, 10)] == [1, 1, 1, 1, 0]
    again, _ = _take_all(client, worker_id=10)
    resumed = {(t.path, t.end): t.start for t in again}
    assert resumed[(tasks[0].path, tasks[0].end)] == tasks[0].start + 8
    assert len(again) == 4


def test_a_worker_keeps_the_task_it_names_as_landing_and_no_other(client, master):
    """A worker may hold the task whose last push is still landing (named in its request)
    beside the one it trains: asking again keeps only the one named; its report completes
    it, whenever it comes."""
    first = client.get_task(0)
    second = client.get_task(0, landing_task_id=first.task_id)
    assert second.type == master_pb2.TASK_TRAINING and second.task_id != first.task_id
    assert (_holder(master, first), _holder(master, second)) == (0, 0)

    third = client.get_task(0, landing_task_id=first.task_id)  # `second` was given up
    assert _holder(master, second) is None
    assert (third.path, third.start, third.end) == (second.path, second.start, second.end)
    assert (_holder(master, first), _holder(master, third)) == (0, 0)

    client.report_task_result(0, first.task_id, first.end - first.start)
    assert master.tasks.tasks_done == 1 and _holder(master, first) is None
    fourth = client.get_task(0, landing_task_id=first.task_id)  # done: nothing to keep
    assert _holder(master, third) is None and _holder(master, fourth) == 0
    client.get_task(0, landing_task_id=10**12)  # not its task: nothing kept
    assert _holder(master, fourth) is None


def test_evaluation_tasks_carry_the_version_and_return_metric_states(client, master, spec):
    tasks, _ = _take_all(client, worker_id=0)
    for worker_id, task in enumerate(tasks):
        client.report_task_result(worker_id, task.task_id, task.end - task.start)
    assert master.tasks.epoch_finished() == 0
    assert master.tasks.start_evaluation(model_version=7)

    evaluations = [client.get_task(0), client.get_task(1)]
    assert [t.type for t in evaluations] == [master_pb2.TASK_EVALUATION] * 2
    assert sorted((t.path, t.start, t.end) for t in evaluations) == [
        ("test-0.tfrecord", 0, 40), ("test-0.tfrecord", 40, 50)]
    assert {t.model_version for t in evaluations} == {7}
    assert client.get_task(2).type == master_pb2.TASK_WAIT  # training waits for the round

    metrics = build_metrics(spec.eval_metrics_fn)
    metrics["accuracy"].update_state(np.array([1, 2]), np.eye(10, dtype=np.float32)[[1, 3]])
    for worker_id, task in enumerate(evaluations):
        client.report_task_result(worker_id, task.task_id, task.end - task.start,
                                  model_version=7, metric_states=to_states(metrics))
    assert master.tasks.evaluation_finished() == (0, 7, True)
    assert master.tasks.tasks_done == 6


def test_metric_states_that_cannot_be_merged_fail_the_attempt_not_the_round(client, master,
                                                                           spec):
    tasks, _ = _take_all(client, worker_id=0)
    for worker_id, task in enumerate(tasks):
        client.report_task_result(worker_id, task.task_id, task.end - task.start)
    assert master.tasks.epoch_finished() == 0 and master.tasks.start_evaluation(7)
    first, second = client.get_task(0), client.get_task(1)
    good = build_metrics(spec.eval_metrics_fn)
    good["accuracy"].update_state(np.array([1, 2]), np.eye(10, dtype=np.float32)[[1, 3]])
    # An AUC's variables under the name "accuracy": each decodes, none fits the metric.
    wrong = build_metrics(lambda: {"accuracy": keras.metrics.AUC()})
    client.report_task_result(0, first.task_id, first.end - first.start, model_version=7,
                              metric_states=to_states(wrong))
    assert master.tasks.tasks_failed == 1 and not master.tasks.failed  # an attempt, retried
    again = client.get_task(2)
    assert (again.path, again.start, again.end) == (first.path, first.start, first.end)
    for worker_id, task in ((1, second), (2, again)):
        client.report_task_result(worker_id, task.task_id, task.end - task.start,
                                  model_version=7, metric_states=to_states(good))
    finished = master.tasks.evaluation_finished()
    assert master.evaluations.close(finished)["metrics"] == {"accuracy": 0.5}


def test_heartbeat_says_when_the_job_has_finished(client, master):
    assert client.heartbeat("ps", 0).job_finished is False
    assert client.heartbeat("worker", 1).job_finished is False
    master.job_finished = True
    assert client.heartbeat("ps", 0).job_finished is True


def test_shards_heartbeat_sooner_once_the_last_tasks_are_handed_out(client, master):
    assert client.heartbeat("ps", 0).next_heartbeat_s == 0  # the usual interval
    first = client.get_task(0)
    assert first.type == master_pb2.TASK_TRAINING
    assert client.heartbeat("ps", 1).next_heartbeat_s == 0  # 3 training tasks wait
    _take_all(client, 1)
    assert client.heartbeat("ps", 0).next_heartbeat_s == pytest.approx(0.2)
    assert client.heartbeat("ps", 1).next_heartbeat_s == pytest.approx(0.2)
    assert client.heartbeat("worker", 0).next_heartbeat_s == 0  # workers ask for tasks
    master.reports.no_more_tasks = True
    assert client.heartbeat("ps", 0).next_heartbeat_s == pytest.approx(0.2)


def test_shards_heartbeat_sooner_only_in_the_last_epoch_and_not_so_often_when_many(spec):
    config = JobConfig(model_def="digits.digits_cnn", training_data="unused", num_ps=15,
                       job_name="servicer-ending-test")
    master = Master(config, spec, engine=LocalInstanceManager(),
                    console=Console(stream=io.StringIO()))
    master.reports.tasks = TaskManager(TRAIN, records_per_task=40, num_epochs=2,
                                       max_task_retries=1, seed=0)
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(master), s)])
    client = MasterClient(f"127.0.0.1:{port}", deadline_s=10.0)
    try:
        _take_all(client, 0)  # epoch 1 of 2: every task out, the next epoch to come
        assert client.heartbeat("ps", 0).next_heartbeat_s == 0
        master.reports.no_more_tasks = True
        # 15 shards come back every 1.5 s: about 10 heartbeats a second in all.
        assert client.heartbeat("ps", 3).next_heartbeat_s == pytest.approx(1.5)
    finally:
        client.close()
        server.stop(grace=None)


def test_workers_learn_where_every_shard_serves_from_heartbeats(client, master):
    client.register_ps(0, "127.0.0.1:7000")
    assert list(client.heartbeat("worker", 1).ps_addresses) == []  # not every shard yet
    client.register_ps(1, "127.0.0.1:7001")
    assert list(client.heartbeat("worker", 1).ps_addresses) == ["127.0.0.1:7000",
                                                                "127.0.0.1:7001"]
    client.register_ps(1, "10.0.0.8:7001")  # relaunched elsewhere
    assert list(client.heartbeat("worker", 1).ps_addresses)[1] == "10.0.0.8:7001"
    assert list(client.heartbeat("ps", 0).ps_addresses) == []  # shards need none


def test_report_version_raises_the_model_version(client, master):
    client.report_version(0, 12)
    client.report_version(1, 5)
    client.report_version(0, 3)  # an older report does not lower it
    assert master.model_version == 12


def test_a_synchronous_shard_gets_the_round_size_only_when_it_changes(spec):
    config = JobConfig(model_def="digits.digits_cnn", training_data="unused", num_workers=2,
                       grads_to_wait=2, job_name="servicer-round-test")
    master = Master(config, spec, console=Console(stream=io.StringIO()))
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(master), s)])
    client = MasterClient(f"127.0.0.1:{port}", deadline_s=10.0)
    try:
        # Before the job has tasks and roles, the master's size is --grads-to-wait.
        assert not client.heartbeat("ps", 0, round_size=2).HasField("sync_round_size")
        assert client.heartbeat("ps", 0, round_size=1).sync_round_size == 2
        assert not client.heartbeat("worker", 0).HasField("sync_round_size")
    finally:
        client.close()
        server.stop(grace=None)
