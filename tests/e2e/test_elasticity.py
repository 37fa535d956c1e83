"""End to end: scaling a running job, preempted and hung workers, starting from checkpoints.

Every test runs a real job (master, parameter servers and workers as processes on 127.0.0.1)
on scikit-learn's digits.
"""

import json
import os
import signal
import uuid

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import job_processes, run_cli, start_cli, wait_for

pytestmark = pytest.mark.slow

RECORDS = 1437


def _job_name(what):
    return f"{what}-{uuid.uuid4().hex[:10]}"


def _train_flags(job_name, out, training_data, **flags):
    defaults = {"model_zoo": ROOT / "model_zoo", "model_def": "digits.digits_cnn",
                "num_workers": 1, "num_ps": 1, "minibatch_size": 16, "num_epochs": 1,
                "num_minibatches_per_task": 8, "progress_report_minibatches": 1}
    args = ["train", "--training-data", training_data, "--output", out, "--job-name", job_name]
    for name, value in {**defaults, **flags}.items():
        args += ["--" + name.replace("_", "-"), value]
    return args


def _summary(out):
    return json.loads((out / "job_summary.json").read_text())


def _all_trained(summary):
    return all(e["records"] == RECORDS and e["trained_never"] == 0 for e in summary["epochs"])


def _role_pid(job, role, index):
    found = [pid for pid, cmd in job_processes(job).items()
             if f"elastic_keras.{role} --{role}-id {index} " in cmd]
    return found[0] if found else None


def _training(out, worker):
    log = out / "logs" / f"worker-{worker}.log"
    return log.exists() and "Model built" in log.read_text(errors="replace")


def _finish(proc, timeout_s=300):
    try:
        proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_scaling_down_and_up_while_the_job_runs(digits_records, tmp_path):
    job, out = _job_name("scale"), tmp_path / "out"
    proc = start_cli(*_train_flags(job, out, digits_records / "train", num_workers=3,
                                   num_epochs=6),
                     log_path=tmp_path / "job.log")
    try:
        wait_for(lambda: all(_training(out, w) for w in range(3)), 180, "3 workers training")
        down = run_cli("scale", "--job-name", job, "--num-workers", 1, timeout=60)
        assert down.returncode == 0, down.stderr
        assert "workers 3 -> 1" in down.stderr
        # The highest ids leave: they hand their task back and exit 0 within the grace.
        wait_for(lambda: (_role_pid(job, "worker", 1) is None
                          and _role_pid(job, "worker", 2) is None), 60,
                 "worker-1 and worker-2 to leave")
        assert _role_pid(job, "worker", 0) is not None
        up = run_cli("scale", "--job-name", job, "--num-workers", 2, timeout=60)
        assert up.returncode == 0, up.stderr
        wait_for(lambda: _role_pid(job, "worker", 3), 60, "the added worker-3")
        assert proc.poll() is None, "the job ended before it was scaled back up"
    finally:
        _finish(proc)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary), summary["epochs"]
    assert summary["num_workers"] == 2
    assert "worker-1 left the job (exited with code 0)" in log
    assert "worker-2 left the job (exited with code 0)" in log
    assert summary["role_exits"] == []  # leaving on request is not a failure
    assert summary["tasks_failed"] == 0


def test_scale_names_the_problem():
    unknown = run_cli("scale", "--job-name", _job_name("nobody"), "--num-workers", 2)
    assert unknown.returncode == 2
    assert "No running job named" in unknown.stderr
    zero = run_cli("scale", "--job-name", "x", "--num-workers", 0)
    assert zero.returncode == 2 and "at least 1. Received: 0" in zero.stderr


def test_a_preempted_worker_hands_its_task_back_and_is_replaced(digits_records, tmp_path):
    job, out = _job_name("preempt"), tmp_path / "out"
    proc = start_cli(*_train_flags(job, out, digits_records / "train", num_workers=2,
                                   num_epochs=4, num_minibatches_per_task=16),
                     log_path=tmp_path / "job.log")
    try:
        wait_for(lambda: _training(out, 0), 180, "worker-0 training")
        pid = _role_pid(job, "worker", 0)
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: _role_pid(job, "worker", 0) not in (None, pid), 60, "worker-0 replaced")
    finally:
        _finish(proc)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary), summary["epochs"]
    assert "worker-0 left without being asked (preempted?)" in log
    worker_log = (out / "logs" / "worker-0.log").read_text()
    if "Handing task" in worker_log:  # SIGTERM landed inside a task, as it nearly always does
        assert summary["recovery"]["tasks_handed_back"] == 1
        # Handed back after a landed minibatch: nothing is trained twice.
        assert sum(e["trained_more_than_once"] for e in summary["epochs"]) == 0
    else:
        assert "told to stop; leaving" in worker_log
    assert summary["tasks_failed"] == 0 and summary["role_exits"][0]["exit_code"] == 0


def test_roles_killed_while_the_job_starts_are_relaunched(digits_records, tmp_path):
    job, out = _job_name("startkill"), tmp_path / "out"
    proc = start_cli(*_train_flags(job, out, digits_records / "train", num_workers=2,
                                   num_ps=2, num_epochs=2),
                     log_path=tmp_path / "job.log")
    try:
        # A PS takes seconds to import TensorFlow: killed as soon as it runs, it has not
        # registered (the log line below says so); nor has the worker.
        for role, index in (("ps", 1), ("worker", 0)):
            pid = wait_for(lambda: _role_pid(job, role, index), 60, f"{role}-{index} started")
            os.kill(pid, signal.SIGKILL)
    finally:
        _finish(proc)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    assert "ps-1 was killed by SIGKILL; relaunched it (1 of 3) before every shard had" in log
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary), summary["epochs"]
    assert summary["recovery"]["relaunches"] == {"ps-1": 1, "worker-0": 1}


def test_a_hung_worker_is_killed_and_relaunched(digits_records, tmp_path):
    job, out = _job_name("hung"), tmp_path / "out"
    proc = start_cli(*_train_flags(job, out, digits_records / "train", num_workers=2,
                                   num_epochs=4, worker_heartbeat_timeout=6),
                     log_path=tmp_path / "job.log")
    try:
        wait_for(lambda: _training(out, 1), 180, "worker-1 training")
        pid = _role_pid(job, "worker", 1)
        os.kill(pid, signal.SIGSTOP)  # alive but silent, as a hung process is
        wait_for(lambda: _role_pid(job, "worker", 1) not in (None, pid), 90, "worker-1 replaced")
    finally:
        _finish(proc)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    assert "worker-1 sent no heartbeat for 6 s" in log
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary), summary["epochs"]
    assert {"role": "worker-1", "exit_code": -signal.SIGKILL, "reason": "killed"} in summary["role_exits"]
    assert summary["recovery"]["relaunches"] == {"worker-1": 1}


def test_a_hung_parameter_server_is_killed_and_relaunched_from_its_checkpoint(
        digits_records, tmp_path):
    job, out = _job_name("hungps"), tmp_path / "out"
    proc = start_cli(*_train_flags(job, out, digits_records / "train", num_workers=2,
                                   num_epochs=4, ps_heartbeat_timeout=6,
                                   checkpoint_dir=tmp_path / "ckpt", checkpoint_steps=10),
                     log_path=tmp_path / "job.log")
    try:
        wait_for(lambda: (tmp_path / "ckpt").is_dir() and any(
            (p / "MANIFEST.json").exists() for p in (tmp_path / "ckpt").iterdir()),
            180, "a checkpoint")
        pid = _role_pid(job, "ps", 0)
        os.kill(pid, signal.SIGSTOP)  # alive but silent: the workers' calls to it hang
        wait_for(lambda: _role_pid(job, "ps", 0) not in (None, pid), 90, "ps-0 replaced")
    finally:
        _finish(proc)
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    assert "ps-0 sent no heartbeat for 6 s" in log
    assert "relaunched it (1 of 3) on port " in log and ", restoring" in log
    summary = _summary(out)
    assert summary["status"] == "succeeded" and _all_trained(summary), summary["epochs"]
    assert {"role": "ps-0", "exit_code": -signal.SIGKILL, "reason": "killed"} in summary["role_exits"]
    assert summary["recovery"]["relaunches"] == {"ps-0": 1}


def test_a_job_starts_from_a_checkpoint_on_more_parameter_servers(digits_records, tmp_path):
    first, ckpt = tmp_path / "first", tmp_path / "ckpt"
    job = _job_name("ckpt")
    flags = _train_flags(job, first, digits_records / "train", num_ps=2, num_epochs=2,
                         validation_data=digits_records / "test", checkpoint_dir=ckpt)
    result = run_cli(*flags)
    assert result.returncode == 0, result.stderr[-5000:]
    trained = _summary(first)
    version = trained["final_model_version"]
    assert trained["recovery"]["checkpoints_written"] == 1  # at the end only
    manifest = json.loads(next(ckpt.glob("ckpt-*/MANIFEST.json")).read_text())
    assert manifest["num_ps"] == 2 and manifest["job_state"]["finished"] is True

    # Re-running the finished job's command resumes it: nothing is left to train.
    again = run_cli(*flags)
    assert again.returncode == 0, again.stderr[-5000:]
    assert "Resuming job" in again.stderr
    assert _summary(first)["examples_trained"] == trained["examples_trained"]

    # Another directory of this job's name is refused.
    other = run_cli(*_train_flags(_job_name("other"), tmp_path / "o", digits_records / "train",
                                  checkpoint_dir=ckpt))
    assert other.returncode == 2
    assert f"holds checkpoints of job {job!r}" in other.stderr

    # A new job on 3 parameter servers starts from that model, re-sharded.
    second = tmp_path / "second"
    result = run_cli(*_train_flags(_job_name("init"), second, digits_records / "train",
                                   num_ps=3, validation_data=digits_records / "test",
                                   checkpoint_dir_for_init=ckpt))
    assert result.returncode == 0, result.stderr[-5000:]
    summary = _summary(second)
    assert summary["final_model_version"] > version
    accuracy = summary["evaluations"][0]["metrics"]["accuracy"]
    assert accuracy >= trained["evaluations"][-1]["metrics"]["accuracy"] - 0.03
    for ps in range(3):
        assert "Restored" in (second / "logs" / f"ps-{ps}.log").read_text()
