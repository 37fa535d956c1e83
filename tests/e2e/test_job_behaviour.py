"""End to end: what a user relies on when a job runs, fails, loses a worker or is stopped.

Every test runs a real job (master, parameter servers and workers as processes talking gRPC
on 127.0.0.1) on scikit-learn's digits, or MNIST for the subclassed model.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import job_processes, read_examples, run_cli, start_cli, wait_for

pytestmark = pytest.mark.slow

ZOO = ROOT / "model_zoo"

# The digits CNN, except that records of the second training file cannot be read.
POISONED_MODULE = """
    import os

    from model_zoo.digits import digits_cnn
    from model_zoo.digits.digits_cnn import custom_model, eval_metrics_fn, loss, optimizer

    POISONED = "data-00001-of-00002"


    def dataset_fn(dataset, mode, metadata):
        if POISONED in metadata.path:
            raise ValueError(f"cannot parse the records of {os.path.basename(metadata.path)}")
        return digits_cnn.dataset_fn(dataset, mode, metadata)
"""

# A small dense network that reads digits from CSV lines by the header's column names.
CSV_MODULE = """
    import keras
    import tensorflow as tf


    def custom_model():
        inputs = keras.Input(shape=(64,), name="pixels")
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(10)(hidden))


    def loss(labels, predictions):
        return tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
            labels, predictions, from_logits=True))


    def optimizer():
        return keras.optimizers.Adam(learning_rate=0.01)


    def dataset_fn(dataset, mode, metadata):
        assert metadata.format == "csv", metadata
        names = list(metadata.column_names)
        pixels = [i for i, name in enumerate(names) if name.startswith("image_")]
        assert len(pixels) == 64, names
        label = names.index("label") if "label" in names else None

        def parse(line):
            columns = tf.io.decode_csv(line, record_defaults=[[0.0]] * len(names))
            image = tf.stack([columns[i] for i in pixels]) / 16.0
            if mode == "prediction":
                return image
            return image, tf.cast(columns[label], tf.int64)

        return dataset.map(parse)


    def eval_metrics_fn():
        return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}
"""


def _job_name(what):
    return f"{what}-{uuid.uuid4().hex[:10]}"


def _summary(out):
    return json.loads((out / "job_summary.json").read_text())


def _train_flags(job_name, out, training_data, **flags):
    defaults = {"model_zoo": ZOO, "model_def": "digits.digits_cnn", "num_workers": 1,
                "num_ps": 1, "minibatch_size": 32, "num_epochs": 1}
    args = ["train", "--training-data", training_data, "--output", out,
            "--job-name", job_name]
    for name, value in {**defaults, **flags}.items():
        args += ["--" + name.replace("_", "-"), value]
    return args


def _assert_no_role_left(job_name):
    # The master waits for its roles before it exits, so nothing may be left at once; a
    # short grace only absorbs /proc catching up.
    deadline = time.monotonic() + 3.0
    while (left := job_processes(job_name)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes of job {job_name} outlived it: {left}"


def _all_trained(summary, records):
    return all(e["records"] == records and e["trained_at_least_once"] == records
               and e["trained_never"] == 0 for e in summary["epochs"])


def _write(path, source):
    path.write_text(textwrap.dedent(source))
    return path


def _model_built(log):
    return log.exists() and "Model built" in log.read_text(errors="replace")


# -- a. a task that keeps failing fails the job ------------------------------------------------


def test_a_task_that_keeps_failing_fails_the_job_with_its_error(digits_records, tmp_path):
    module = _write(tmp_path / "poisoned.py", POISONED_MODULE)
    job, out = _job_name("poisoned"), tmp_path / "out"
    result = run_cli(*_train_flags(job, out, digits_records / "train", model_def=module,
                                   max_task_retries=1))

    assert result.returncode == 1, result.stderr[-5000:]
    assert f"Job {job} FAILED" in result.stderr
    summary = _summary(out)
    assert summary["status"] == "failed"
    error = summary["error"]
    assert "training task on " in error and "data-00001-of-00002.tfrecord records [" in error
    assert "failed 2 times" in error
    assert "ValueError: cannot parse the records of data-00001-of-00002.tfrecord" in error
    assert summary["tasks_failed"] == 2  # --max-task-retries 1: one re-queue, then give up
    assert summary["tasks_requeued"] == 1
    assert summary["saved_model"] == "" and not (out / "saved_model").exists()
    # The worker's log holds the traceback of the original error.
    assert "cannot parse the records" in (out / "logs" / "worker-0.log").read_text()
    _assert_no_role_left(job)


# -- b. a worker killed mid-job ----------------------------------------------------------------


def test_a_killed_worker_does_not_lose_records(digits_records, tmp_path):
    """Without relaunches, the job carries on with the worker it has left."""
    job, out = _job_name("killworker"), tmp_path / "out"
    proc = start_cli(
        *_train_flags(job, out, digits_records / "train", num_workers=2, num_epochs=2,
                      num_minibatches_per_task=4, progress_report_minibatches=1,
                      relaunch_on_worker_failure=0),
        log_path=tmp_path / "job.log",
    )
    try:
        logs = out / "logs"
        victim = wait_for(
            lambda: next((w for w in ("worker-0", "worker-1")
                          if _model_built(logs / f"{w}.log")), None),
            timeout_s=120, what="a worker to start training",
        )
        time.sleep(1.0)  # well into a task
        pids = [pid for pid, cmd in job_processes(job).items()
                if "elastic_keras.worker" in cmd and f"--worker-id {victim[-1]} " in cmd + " "]
        assert len(pids) == 1, job_processes(job)
        assert proc.poll() is None, "the job ended before the worker could be killed"
        os.kill(pids[0], signal.SIGKILL)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "job.log").read_text()

    assert proc.returncode == 0, log[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded"
    assert _all_trained(summary, 1437), summary["epochs"]
    # The lost worker's task resumed after its last progress report: at most the minibatch
    # in flight when it died is trained twice.
    assert sum(e["trained_more_than_once"] for e in summary["epochs"]) <= 32
    assert summary["role_exits"] == [{"role": victim, "exit_code": -signal.SIGKILL, "reason": "killed"}]
    assert summary["tasks_requeued"] >= 0 and summary["tasks_failed"] == 0
    assert f"{victim} was killed by SIGKILL" in log
    # Not relaunched (--relaunch-on-worker-failure 0): the job carried on with one worker.
    assert "not relaunched" in log and summary["recovery"]["relaunches"] == {}
    _assert_no_role_left(job)


def test_sync_rounds_go_on_with_the_workers_left_alive(digits_records, tmp_path):
    """A worker killed (not relaunched) in a synchronous job with --grads-to-wait 2: the
    rounds close with the one worker left, instead of each waiting for a push that will not
    come until --sync-round-timeout-s (set far beyond this test's patience)."""
    job, out = _job_name("syncalive"), tmp_path / "out"
    proc = start_cli(
        *_train_flags(job, out, digits_records / "train", num_workers=2, num_ps=2,
                      num_epochs=1, grads_to_wait=2, sync_round_timeout_s=900,
                      relaunch_on_worker_failure=0),
        log_path=tmp_path / "job.log",
    )
    try:
        logs = out / "logs"
        wait_for(lambda: all(_model_built(logs / f"worker-{i}.log") for i in (0, 1)),
                 timeout_s=120, what="both workers to start training")
        pids = [pid for pid, cmd in job_processes(job).items()
                if "elastic_keras.worker" in cmd and "--worker-id 1 " in cmd + " "]
        assert len(pids) == 1 and proc.poll() is None, job_processes(job)
        os.kill(pids[0], signal.SIGKILL)
        proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    assert _all_trained(_summary(out), 1437)
    ps_logs = "".join((out / "logs" / f"ps-{i}.log").read_text() for i in (0, 1))
    assert "A synchronous round waited" not in ps_logs


# -- c. Ctrl-C and SIGTERM ---------------------------------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_train_stops_every_role(digits_records, tmp_path, signum):
    job, out = _job_name("signal"), tmp_path / "out"
    proc = start_cli(
        *_train_flags(job, out, digits_records / "train", num_epochs=20, minibatch_size=16,
                      progress_report_minibatches=1),
        log_path=tmp_path / "job.log",
    )
    try:
        wait_for(lambda: _model_built(out / "logs" / "worker-0.log"), timeout_s=120,
                 what="worker-0 to start training")
        time.sleep(3.0)  # some minibatches trained and reported
        roles = job_processes(job)
        assert len(roles) == 3, roles  # the master, ps-0 and worker-0
        proc.send_signal(signum)
        sent = time.monotonic()
        proc.wait(timeout=30)
        stopped_in = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 130, log[-5000:]
    assert stopped_in < 20.0
    # Each role left on its own: the worker was stopped while the PS still answered its
    # last push, so none was killed at the end of its grace.
    assert "ignored SIGTERM" not in log, log[-5000:]
    _assert_no_role_left(job)
    summary = _summary(out)
    assert summary["status"] == "interrupted"
    assert summary["error"] == "interrupted (Ctrl-C or SIGTERM)"
    assert 0 < summary["examples_trained"] < 20 * 1437  # stopped mid-training
    assert summary["saved_model"] == ""


# -- d. CSV data --------------------------------------------------------------------------------


def test_training_on_csv_files_by_column_name(digits_csv, tmp_path):
    module = _write(tmp_path / "digits_csv_model.py", CSV_MODULE)
    job, out = _job_name("csv"), tmp_path / "out"
    result = run_cli(*_train_flags(job, out, digits_csv / "train", model_def=module,
                                   validation_data=digits_csv / "test", num_epochs=2))

    assert result.returncode == 0, result.stderr[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded"
    assert _all_trained(summary, 1437)
    assert [e["epoch"] for e in summary["evaluations"]] == [1, 2]
    assert summary["evaluations"][-1]["metrics"]["accuracy"] > 0.8
    _assert_no_role_left(job)


# -- e. a subclassed model ---------------------------------------------------------------------


def test_a_subclassed_model_trains_and_exports(mnist_records, tmp_path):
    import tensorflow as tf

    job, out = _job_name("subclass"), tmp_path / "out"
    result = run_cli(*_train_flags(job, out, mnist_records / "train",
                                   model_def="mnist.mnist_subclass", minibatch_size=64))

    assert result.returncode == 0, result.stderr[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary, 4000)
    loaded = tf.saved_model.load(str(out / "saved_model"))
    images, labels = read_examples(mnist_records / "test", 784)
    logits = loaded.serve(tf.constant(images.reshape(-1, 28, 28, 1) / 255.0)).numpy()
    assert logits.shape == (1000, 10)
    assert float(np.mean(logits.argmax(axis=1) == labels)) > 0.8


# -- f. the Python API -------------------------------------------------------------------------

API_SCRIPT = """
    import json, sys
    import elastic_keras
    from elastic_keras.common.errors import DataError

    zoo, train, test, out, bad_out, job = sys.argv[1:]
    try:
        elastic_keras.train(model_zoo=zoo, model_def="digits.digits_cnn",
                            training_data="/nonexistent/*.tfrecord", output=bad_out,
                            job_name=job + "-bad")
    except DataError as exc:
        print("DATA ERROR:", exc, flush=True)
    else:
        sys.exit("no DataError")
    summary = elastic_keras.train(
        model_zoo=zoo, model_def="digits.digits_cnn", training_data=train,
        validation_data=test, num_workers=1, num_ps=1, minibatch_size=32, num_epochs=1,
        output=out, job_name=job,
    )
    print("SUMMARY", type(summary).__name__, json.dumps(summary.to_dict()), flush=True)
"""


def test_the_python_api_returns_the_summary_and_rejects_bad_data(digits_records, tmp_path):
    job, out, bad_out = _job_name("api"), tmp_path / "out", tmp_path / "bad"
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(API_SCRIPT), str(ZOO),
         str(digits_records / "train"), str(digits_records / "test"), str(out), str(bad_out),
         job],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-5000:]

    data_error = next(line for line in result.stdout.splitlines()
                      if line.startswith("DATA ERROR:"))
    assert "/nonexistent/*.tfrecord" in data_error
    assert not list(bad_out.glob("logs/*.log")), "a role was launched for bad data"

    line = next(line for line in result.stdout.splitlines() if line.startswith("SUMMARY "))
    kind, payload = line.split(" ", 2)[1:]
    summary = json.loads(payload)
    assert kind == "JobSummary"
    assert summary["status"] == "succeeded" and summary["error"] == ""
    assert summary["job_name"] == job
    assert _all_trained(summary, 1437)
    assert summary["evaluations"][-1]["metrics"]["accuracy"] > 0.5
    assert json.loads((out / "job_summary.json").read_text()) == summary
    _assert_no_role_left(job)


# -- g. two parameter servers ------------------------------------------------------------------


def test_two_parameter_servers_export_the_evaluated_model(digits_records, tmp_path):
    import keras
    import tensorflow as tf

    from elastic_keras.common.model_variables import named_variables
    from elastic_keras.common.partition import dense_shard
    from model_zoo.digits.digits_cnn import custom_model

    # The model's variables land on both shards.
    keras.utils.clear_session()
    model = custom_model()
    assert {dense_shard(name, 2) for name in named_variables(model)} == {0, 1}

    job, out = _job_name("twops"), tmp_path / "out"
    result = run_cli(*_train_flags(job, out, digits_records / "train", num_ps=2,
                                   validation_data=digits_records / "test"))
    assert result.returncode == 0, result.stderr[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded" and summary["num_ps"] == 2
    assert _all_trained(summary, 1437)
    for ps in ("ps-0", "ps-1"):
        assert "Registered" in (out / "logs" / f"{ps}.log").read_text()

    evaluated = summary["evaluations"][-1]["metrics"]["accuracy"]
    loaded = tf.saved_model.load(str(out / "saved_model"))
    images, labels = read_examples(digits_records / "test", 64)
    logits = loaded.serve(tf.constant(images.reshape(-1, 8, 8, 1) / 16.0)).numpy()
    accuracy = float(np.mean(logits.argmax(axis=1) == labels))
    assert len(labels) == 360
    assert accuracy == pytest.approx(evaluated, abs=1e-6)
    assert accuracy > 0.5
