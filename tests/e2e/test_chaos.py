"""Chaos: workers, a parameter server and the master are killed during a real MNIST job.

3 workers and 2 PS train MNIST (4,000 records, 6 epochs) with checkpoints. While the job runs
the test SIGKILLs a worker three times, a PS once, adds a worker with `elastic-keras scale`,
then SIGKILLs the master and runs the same command again, which resumes from the latest
checkpoint. The job must complete with every record of every epoch trained, duplicates within
the stated bound, and held-out accuracy >= 0.90 and no more than 1.5 points below the same job
run without faults. Each fault waits for the job to have recovered from the previous one, so the
sequence does not depend on timing; every wait is bounded.
"""

import json
import os
import signal

import numpy as np
import pytest
import tensorflow as tf

from tests.e2e.conftest import (
    decaying_mnist_module, job_processes, read_examples, run_cli, start_cli, wait_for,
)

pytestmark = pytest.mark.slow

EPOCHS = 6
WAIT_S = 240


def _args(records, out, ckpt, job, module):
    return [
        "train", "--model-def", module,
        "--training-data", records / "train", "--validation-data", records / "test",
        "--num-workers", 3, "--num-ps", 2, "--minibatch-size", 64, "--num-epochs", EPOCHS,
        "--shuffle-seed", 7, "--output", out, "--job-name", job,
        *(["--checkpoint-dir", ckpt, "--checkpoint-steps", 30] if ckpt else []),
    ]


def _role_pid(job, role, index):
    """The pid of `role` number `index` of `job`, or None."""
    prefix = f"elastic_keras.{role} --{role}-id {index} "
    found = [pid for pid, cmd in job_processes(job).items() if prefix in cmd]
    return found[0] if found else None


def _complete_checkpoints(ckpt):
    if not ckpt.exists():
        return []
    return sorted(p.name for p in ckpt.iterdir() if (p / "MANIFEST.json").exists())


def _new_checkpoint_after(ckpt, seen):
    return [c for c in _complete_checkpoints(ckpt) if c > max(seen, default="")]


def _kill_and_wait_for_relaunch(job, role, index, ckpt):
    pid = wait_for(lambda: _role_pid(job, role, index), WAIT_S, f"{role}-{index} to run")
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _role_pid(job, role, index) not in (None, pid), WAIT_S,
             f"{role}-{index} to be relaunched")
    # Recovered: the job still trains, as a checkpoint taken after the relaunch shows.
    seen = _complete_checkpoints(ckpt)
    wait_for(lambda: _new_checkpoint_after(ckpt, seen), WAIT_S,
             f"a checkpoint after {role}-{index} was relaunched")


def _accuracy(out, records):
    images, labels = read_examples(records / "test", 784)
    loaded = tf.saved_model.load(str(out / "saved_model"))
    logits = loaded.serve(tf.constant((images / 255.0).reshape(-1, 28, 28, 1))).numpy()
    return float(np.mean(logits.argmax(axis=1) == labels))


def test_a_job_survives_killed_workers_ps_and_master(mnist_records, tmp_path):
    # The same job without faults, for the accuracy it should reach.
    # About 380 versions in all: 63 minibatches per epoch.
    module = decaying_mnist_module(tmp_path / "mnist_decaying.py", versions=390)
    calm = tmp_path / "calm"
    result = run_cli(*_args(mnist_records, calm, None, "chaos-calm", module), timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    calm_accuracy = _accuracy(calm, mnist_records)

    job, out, ckpt = "chaos-e2e", tmp_path / "out", tmp_path / "ckpt"
    args = _args(mnist_records, out, ckpt, job, module)
    master = start_cli(*args, log_path=tmp_path / "first_run.log")
    try:
        wait_for(lambda: _complete_checkpoints(ckpt), WAIT_S, "the first checkpoint")
        _kill_and_wait_for_relaunch(job, "worker", 0, ckpt)
        _kill_and_wait_for_relaunch(job, "worker", 1, ckpt)
        _kill_and_wait_for_relaunch(job, "ps", 1, ckpt)
        scaled = run_cli("scale", "--job-name", job, "--num-workers", 4, timeout=60)
        assert scaled.returncode == 0, scaled.stderr
        assert "workers 3 -> 4" in scaled.stderr
        wait_for(lambda: _role_pid(job, "worker", 3), WAIT_S, "the added worker-3")
        _kill_and_wait_for_relaunch(job, "worker", 0, ckpt)
        assert master.poll() is None, "the job ended before the master could be killed"
        master.send_signal(signal.SIGKILL)
        master.wait(timeout=30)
        wait_for(lambda: not job_processes(job), 60,
                 "every role to exit after the master died",
                 left=lambda: job_processes(job))
    finally:
        if master.poll() is None:
            master.kill()
            master.wait()
    first_run = (tmp_path / "first_run.log").read_text()
    assert "relaunched it (1 of 3)" in first_run and "Scaled up: started worker-3" in first_run
    assert not (out / "job_summary.json").exists()  # the master died before writing it

    # The same command again resumes from the latest checkpoint.
    result = run_cli(*args, timeout=900)
    assert result.returncode == 0, result.stderr[-5000:]
    assert "Resuming job chaos-e2e from" in result.stderr
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded"
    assert summary["recovery"]["resumed_from"].startswith(str(ckpt))
    assert [e["records"] for e in summary["epochs"]] == [4000] * EPOCHS
    assert all(e["trained_never"] == 0 for e in summary["epochs"])
    bound = summary["recovery"]["duplicates_bound_per_lost_task"]
    assert bound == (4 + 1) * 64
    # Three SIGKILLed workers lost at most one task attempt each (and a task held too long
    # is lost too); what a lost attempt trained past its last report is trained again, at
    # most `bound` records, which the summary's upper count adds.
    lost = sum(e["tasks_lost"] for e in summary["epochs"])
    assert lost <= 3 + summary["recovery"]["tasks_timed_out"]
    assert sum(e["trained_more_than_once"] for e in summary["epochs"]) <= 3 * bound
    assert all(e["trained_more_than_once_at_most"]
               == e["trained_more_than_once"] + e["tasks_lost"] * bound
               for e in summary["epochs"])
    assert len(_complete_checkpoints(ckpt)) <= 3  # --keep-checkpoint-max
    # The account covers both runs: the first run's relaunches and deaths are kept.
    relaunches = summary["recovery"]["relaunches"]
    assert relaunches["worker-0"] == 2 and relaunches["worker-1"] == 1
    assert relaunches["ps-1"] == 1
    assert {"role": "ps-1", "exit_code": -signal.SIGKILL, "reason": "killed"} in summary["role_exits"]

    accuracy = _accuracy(out, mnist_records)
    assert accuracy >= 0.90
    # As good as the job without faults, within 1.5 points. Asynchronous runs differ by a point
    # or so either way (seen: 0.963 with faults against 0.948 without), so only falling short
    # counts; 1e-9 absorbs the rounding of the difference of two float32 accuracies.
    assert accuracy >= calm_accuracy - 0.015 - 1e-9, (accuracy, calm_accuracy)
