"""The worker's task loop on real CSV records, a real shard on 127.0.0.1 and a fake master:
what a task reports when the loss is NaN (`--on-non-finite-loss fail|skip`), when the module
breaks the contract, when `dataset_fn` cannot parse a record, and when a shard refuses a
push; and that a worker over many files keeps the pipelines of the few it read last."""

import dataclasses
import os
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.config import WorkerConfig
from elastic_keras.common.errors import PayloadError
from elastic_keras.common.model_spec import ModelSpec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.proto import master_pb2
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.worker import task_loop
from elastic_keras.worker.task_loop import TaskLoop
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import serve

GOOD = ["1,2", "3,4", "5,6", "7,8", "2,1", "4,3"]
WITH_NAN = GOOD[:4] + ["nan,1"] + GOOD[4:]  # record 4: the first of minibatch 3


def custom_model():
    inputs = keras.Input((1,), name="x")
    return keras.Model(inputs, keras.layers.Dense(1, name="out")(inputs))


def mean_squared_error(labels, predictions):
    return tf.reduce_mean(tf.square(predictions - labels))


def per_example_loss(labels, predictions):
    return tf.square(predictions - labels)[:, 0]


def mismatched_loss(labels, predictions):
    one_hot = tf.concat([labels, labels], 1)  # 2 classes, against 3 outputs
    return tf.reduce_mean(keras.losses.categorical_crossentropy(
        one_hot, tf.concat([predictions] * 3, 1)))


def parse(dataset, mode, metadata):
    columns = dataset.map(lambda line: tf.io.decode_csv(line, [[0.0], [0.0]]))
    return columns.map(lambda x, y: (tf.reshape(x, [1]), tf.reshape(y, [1])))


def features_only(dataset, mode, metadata):
    return parse(dataset, mode, metadata).map(lambda x, y: x)


def spec(loss=mean_squared_error, dataset_fn=parse):
    return ModelSpec("health_test", custom_model, loss, lambda: keras.optimizers.SGD(0.01),
                     dataset_fn)


class FakeMaster:
    """Hands out `tasks`, then none; keeps every report, and every call in `calls`."""

    def __init__(self, tasks):
        self.tasks, self.results, self.progress, self.calls = list(tasks), [], [], []

    def get_task(self, worker_id, landing_task_id=0):
        self.calls.append(("get_task", landing_task_id))
        return self.tasks.pop(0) if self.tasks else master_pb2.Task(type=master_pb2.TASK_NONE)

    def report_task_result(self, worker_id, task_id, records_done, **report):
        self.calls.append(("result", task_id))
        self.results.append({"worker_id": worker_id, "task_id": task_id,
                             "records_done": records_done, **report})

    def report_progress(self, *report):
        self.progress.append(report)


@pytest.fixture(params=["async", "sync", "overlap"])
def shard(request):
    """(strategy, the shard's `Parameters`, a `PSClient` to it)."""
    sync = request.param == "sync"
    parameters = Parameters(UpdatePolicy(grads_to_wait=1) if sync else UpdatePolicy())
    server, port = serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    yield request.param, parameters, client
    client.close()
    server.stop(0)


def run_task(tmp_path, shard, rows, model_spec=None, on_non_finite_loss="fail"):
    """Runs one training task over `rows` (CSV lines under the header "x,y") in
    minibatches of 2; returns (the task's result report, the fake master)."""
    strategy, _, client = shard
    path = tmp_path / "data.csv"
    path.write_text("x,y\n" + "\n".join(rows) + "\n")
    config = WorkerConfig(worker_id=3, master_addr="127.0.0.1:1", model_def="m",
                          minibatch_size=2, progress_report_minibatches=1,
                          on_non_finite_loss=on_non_finite_loss, sync=strategy == "sync",
                          index_cache_dir=str(tmp_path / "index"))
    master = FakeMaster([master_pb2.Task(task_id=7, type=master_pb2.TASK_TRAINING,
                                         path=str(path), start=0, end=len(rows))])
    model_spec = model_spec or spec()
    trainer = Trainer(model_spec, client, worker_id=3, strategy=strategy)
    TaskLoop(config, model_spec, master, trainer).run()
    [result] = master.results
    return result, master


def _finite_model(parameters):
    values = parameters.pull().dense
    return values and all(np.all(np.isfinite(v)) for v in values.values())


def test_a_nan_loss_fails_the_job_naming_minibatch_task_and_worker(tmp_path, shard):
    result, _ = run_task(tmp_path, shard, WITH_NAN)
    error = result["error"]
    assert error.startswith("NonFiniteLossError: The training loss is nan in minibatch 3 ")
    assert f"(records [4, 6) of {tmp_path / 'data.csv'}) of task 7 on worker 3" in error
    assert result["fatal"] == "non_finite_loss"
    assert result["minibatches"] == 2 and result["records_done"] == 4
    _, parameters, _ = shard
    assert parameters.applied_pushes == {3: 2}  # nothing of minibatch 3 was pushed
    assert _finite_model(parameters)


def test_skip_drops_a_nan_minibatch_counts_it_and_trains_on(tmp_path, shard):
    result, master = run_task(tmp_path, shard, WITH_NAN, on_non_finite_loss="skip")
    assert not result.get("error") and not result.get("fatal")
    assert result["skipped"] == {"non_finite_loss": 1}
    assert result["records_done"] == 7 and result["minibatches"] == 3
    assert np.isfinite(result["loss"])
    _, parameters, _ = shard
    assert parameters.applied_pushes == {3: 3}
    assert _finite_model(parameters)
    # Progress reports count what was pushed, and what was skipped so far.
    assert [(p[5], p[6]) for p in master.progress] == [
        (1, {}), (2, {}), (2, {"non_finite_loss": 1}), (3, {"non_finite_loss": 1})]


def test_a_loss_that_is_not_a_scalar_fails_the_job_as_a_bad_module(tmp_path, shard):
    result, _ = run_task(tmp_path, shard, GOOD, spec(loss=per_example_loss))
    assert result["error"].startswith(
        "ModelSpecError: Model module 'health_test': `loss(labels, predictions)` must return "
        "a scalar")
    assert "Received: a tensor of shape (" in result["error"]
    assert result["fatal"] == "model_module" and result["minibatches"] == 0


def test_a_dataset_fn_of_features_only_is_named(tmp_path, shard):
    result, _ = run_task(tmp_path, shard, GOOD, spec(dataset_fn=features_only))
    assert result["error"].startswith(
        "ModelSpecError: Model module 'health_test': `dataset_fn(dataset, mode='training', "
        "metadata)` must return a dataset of (features, labels) pairs")
    assert result["error"].endswith("Received: a dataset of single float32 tensors of shape "
                                    "(1,)")
    assert result["fatal"] == "model_module"


def test_a_shape_mismatch_is_one_line_with_the_users_frame(tmp_path, shard):
    result, _ = run_task(tmp_path, shard, GOOD, spec(loss=mismatched_loss))
    error = result["error"]
    assert "\n" not in error and len(error) < 700
    assert "Traceback" not in error and "in user code" not in error
    assert error.startswith(("ValueError:", "InvalidArgumentError:"))
    assert f"(at {__file__}:" in error and "in mismatched_loss)" in error
    assert result["fatal"] == ""  # retried, as any other error


def test_a_row_dataset_fn_cannot_parse_is_named_by_file_record_and_line(tmp_path, shard):
    rows = GOOD[:3] + ["oops,1"] + GOOD[3:]
    result, _ = run_task(tmp_path, shard, rows)
    error = result["error"]
    assert error.startswith("DataError: The module's dataset_fn cannot parse record 3 of "
                            f"{tmp_path / 'data.csv'} (line 5): ")
    assert "oops" in error and "record 0" not in error
    assert result["minibatches"] == 1 and result["fatal"] == ""


def nan_gradient_loss(labels, predictions):
    """A finite loss (0 is added) whose gradient is NaN: the norm of a zero vector."""
    return mean_squared_error(labels, predictions) + tf.norm(predictions * 0.0)


def test_nan_gradients_of_a_finite_loss_are_never_pushed(tmp_path, shard):
    """Not to any shard: one shard refusing a push that another applied would leave the
    minibatch half applied."""
    result, _ = run_task(tmp_path, shard, GOOD, spec(loss=nan_gradient_loss))
    assert "NonFiniteLossError: The training loss is " in result["error"]
    assert "holds NaN or Inf in minibatch 1 " in result["error"]
    assert result["fatal"] == "non_finite_loss"
    _, parameters, _ = shard
    assert parameters.applied_pushes == {} and parameters.non_finite_pushes == 0


def parse_batches(dataset, mode, metadata):
    columns = dataset.map(lambda lines: tf.io.decode_csv(lines, [[0.0], [0.0]]))
    return columns.map(lambda x, y: (tf.reshape(x, [-1, 1]), tf.reshape(y, [-1, 1])))


class CountingMaster(FakeMaster):
    """Notes the process's threads (native ones too) each time it is asked for a task."""

    def __init__(self, tasks):
        super().__init__(tasks)
        self.threads = []

    def get_task(self, worker_id, landing_task_id=0):
        self.threads.append(len(os.listdir("/proc/self/task")))
        return super().get_task(worker_id, landing_task_id)


def test_a_worker_over_many_files_keeps_the_pipelines_of_the_last_few(tmp_path, monkeypatch):
    """A `batch_dataset_fn` pipeline holds a live iterator's threads (about 5): over 10
    files, twice, the worker holds those of the 2 files it read last, and a file it read
    before opens again and trains."""
    monkeypatch.setattr(task_loop, "OPEN_FILES", 2)
    paths = [tmp_path / f"part-{i}.csv" for i in range(10)]
    for path in paths:
        path.write_text("x,y\n" + "\n".join(GOOD) + "\n")
    tasks = [master_pb2.Task(task_id=i, type=master_pb2.TASK_TRAINING, path=str(path), start=0,
                             end=len(GOOD)) for i, path in enumerate(paths * 2)]
    parameters = Parameters(UpdatePolicy())
    server, port = serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    try:
        config = WorkerConfig(worker_id=3, master_addr="127.0.0.1:1", model_def="m",
                              minibatch_size=2, index_cache_dir=str(tmp_path / "index"))
        model_spec = dataclasses.replace(spec(), batch_dataset_fn=parse_batches)
        master = CountingMaster(tasks)
        TaskLoop(config, model_spec, master, Trainer(model_spec, client, worker_id=3)).run()
    finally:
        client.close()
        server.stop(0)
    assert [r["records_done"] for r in master.results] == [len(GOOD)] * 20
    assert not any(r.get("error") for r in master.results)
    assert parameters.applied_pushes == {3: 20 * len(GOOD) // 2}
    # Two files open from the third task on; without the bound, 5 more threads a file.
    assert max(master.threads[3:]) - master.threads[3] < 10, master.threads


class FailingPush(Parameters):
    """Refuses the `failing`-th push it is sent (counting from 1) as a bad payload."""

    def __init__(self, failing):
        super().__init__(UpdatePolicy())
        self.failing, self.pushes = failing, 0

    def push(self, push):
        self.pushes += 1
        if self.pushes == self.failing:
            raise PayloadError(f"push {self.pushes} is refused here")
        return super().push(push)


def test_a_push_a_shard_refuses_fails_the_task_with_the_shards_answer(tmp_path):
    """The task is reported failed after the minibatch that landed, its error the status and
    details the shard answered (not the gRPC call's representation)."""
    parameters = FailingPush(failing=2)
    server, port = serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    try:
        result, _ = run_task(tmp_path, ("overlap", parameters, client), GOOD)
    finally:
        client.close()
        server.stop(0)
    assert result["error"] == "RpcError: INVALID_ARGUMENT: push 2 is refused here"
    assert (result["records_done"], result["minibatches"]) == (2, 1)
    assert parameters.applied_pushes[3] == 1


class SlowPush(Parameters):
    """Answers the `slow`-th push it is sent (counting from 1) `delay_s` late."""

    def __init__(self, slow, delay_s, policy):
        super().__init__(policy)
        self.slow, self.delay_s, self.pushes = slow, delay_s, 0

    def push(self, push):
        self.pushes += 1
        if self.pushes == self.slow:
            time.sleep(self.delay_s)
        return super().push(push)


def run_two_tasks(tmp_path, strategy, parameters):
    """Trains task 7 (records [0, 6) of a CSV file) then task 8 (records [6, 12)) in
    minibatches of 2 against a shard serving `parameters`; returns the fake master."""
    path = tmp_path / "data.csv"
    path.write_text("x,y\n" + "\n".join(GOOD * 2) + "\n")
    server, port = serve(parameters)
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    config = WorkerConfig(worker_id=3, master_addr="127.0.0.1:1", model_def="m",
                          minibatch_size=2, sync=strategy == "sync",
                          index_cache_dir=str(tmp_path / "index"))
    master = FakeMaster([
        master_pb2.Task(task_id=task_id, type=master_pb2.TASK_TRAINING, path=str(path),
                        start=start, end=start + 6)
        for task_id, start in ((7, 0), (8, 6))
    ])
    try:
        TaskLoop(config, spec(), master, Trainer(spec(), client, 3, strategy=strategy)).run()
    finally:
        client.close()
        server.stop(0)
    return master


@pytest.mark.parametrize("strategy", ["async", "sync", "overlap"])
def test_a_trained_task_is_reported_once_its_last_push_lands_while_the_next_runs(tmp_path,
                                                                                strategy):
    """Overlapped, the worker asks for its next task while the last push of a task is still
    landing (the master keeps that task, named), and reports it once the push lands; a
    worker that leaves lands its last push and reports first. Other strategies have landed
    every push when a task ends, and report before they ask."""
    policy = UpdatePolicy(grads_to_wait=1) if strategy == "sync" else UpdatePolicy()
    parameters = SlowPush(slow=3, delay_s=0.5, policy=policy)  # task 7's last push
    master = run_two_tasks(tmp_path, strategy, parameters)
    if strategy == "overlap":
        assert master.calls == [("get_task", 0), ("get_task", 7), ("result", 7),
                                ("get_task", 8), ("result", 8)]
    else:
        assert master.calls == [("get_task", 0), ("result", 7), ("get_task", 0),
                                ("result", 8), ("get_task", 0)]
    assert [(r["task_id"], r["records_done"], r["minibatches"], r.get("error", ""))
            for r in master.results] == [(7, 6, 3, ""), (8, 6, 3, "")]
    assert parameters.applied_pushes[3] == 6


def test_a_failed_last_push_fails_its_task_and_the_next_task_goes_back(tmp_path):
    """The next task meets the failure of the last push of the one before (its first wait
    is for that push): the task before is reported failed after the minibatches that
    landed, and the next one, which has pushed nothing, is handed back whole."""
    parameters = FailingPush(failing=3)  # task 7's last push
    master = run_two_tasks(tmp_path, "overlap", parameters)
    failed, handed_back = master.results
    assert (failed["task_id"], failed["records_done"], failed["minibatches"]) == (7, 4, 2)
    assert failed["error"] == "RpcError: INVALID_ARGUMENT: push 3 is refused here"
    assert (handed_back["task_id"], handed_back["records_done"]) == (8, 0)
    assert handed_back["abandoned"]
    assert parameters.applied_pushes[3] == 2


class WaitRecorder:
    """A stop event that records how long the loop waits each time (and never waits)."""

    def __init__(self):
        self.waits = []

    def is_set(self):
        return False

    def wait(self, seconds):
        self.waits.append(seconds)


def test_a_worker_told_to_wait_asks_again_soon_then_less_often():
    """An epoch's turn takes the master milliseconds: the first wait is short, each next one
    twice as long up to `WAIT_S`, and a task handed out starts the backoff afresh."""
    wait = master_pb2.Task(type=master_pb2.TASK_WAIT)
    evaluate = master_pb2.Task(task_id=1, type=master_pb2.TASK_EVALUATION)
    master = FakeMaster([wait] * 7 + [evaluate] + [wait] * 2)
    stop = WaitRecorder()
    loop = TaskLoop(WorkerConfig(worker_id=0, master_addr="127.0.0.1:1", model_def="m"),
                    spec(), master, trainer=None, stop=stop)
    ran = []
    loop._run_task = ran.append
    loop.run()
    first, most = task_loop.FIRST_WAIT_S, task_loop.WAIT_S
    backoff = [min(first * 2 ** i, most) for i in range(7)]
    assert stop.waits == backoff + backoff[:2]
    assert backoff[-1] == most and backoff[0] < most / 10
    assert ran == [evaluate]
