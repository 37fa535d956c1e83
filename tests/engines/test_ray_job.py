"""A whole job on Ray: `elastic-keras train --engine ray` on a Ray cluster that the master
starts on 127.0.0.1 for the job. Its actors are killed from another Ray driver (as an
operator's `ray.kill`, or a lost node, would) and a worker's process is SIGKILLed; the master
replaces each, the job trains every record, and no process of the job or its cluster is left.

What this covers: placement, actors, the roles' private data and advertised addresses, output
and exits through the engine, and its cluster's lifetime, all on a real single-node cluster.
What it does not: several nodes (every node address is 127.0.0.1) and resources a node
lacks (see test_ray_engine.py for a role that cannot be placed).
"""

import json
import re
import subprocess
import sys
import uuid

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import digits_records, start_cli, wait_for  # noqa: F401 - a fixture
from tests.engines.process_marks import marked_processes

pytest.importorskip("ray")
RECORDS = 1437
KILL_ACTOR = """
import sys, ray
ray.init(address=sys.argv[1], namespace=sys.argv[2], log_to_driver=False)
ray.kill(ray.get_actor(sys.argv[3]))
"""


def _log(path):
    return path.read_text(errors="replace") if path.exists() else ""


def _found(pattern, log):
    match = re.search(pattern, log)
    assert match, f"the master's log has no line matching {pattern!r}: {log[-3000:]}"
    return match.groups()


def _kill_actor(address, namespace, actor):
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, "-c", KILL_ACTOR, address, namespace, actor],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_on_ray_survives_killed_actors_and_a_killed_worker(digits_records, tmp_path):
    job, out = f"ray-{uuid.uuid4().hex[:8]}", tmp_path / "out"
    mark = {"EK_TEST_RAY_JOB": job}
    proc = start_cli(
        "train", "--engine", "ray", "--job-name", job,
        "--model-zoo", ROOT / "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train", "--output", out,
        "--num-workers", 2, "--num-ps", 1, "--minibatch-size", 16, "--num-epochs", 6,
        "--num-minibatches-per-task", 8, "--checkpoint-dir", tmp_path / "ckpt",
        "--checkpoint-steps", 40, log_path=tmp_path / "job.log", env=mark)
    logs = out / "logs"
    try:
        for worker in (0, 1):
            wait_for(lambda: "Model built" in _log(logs / f"worker-{worker}.log"), 240,
                     f"worker-{worker} training")
        master_log = _log(tmp_path / "job.log")
        address, namespace = _found(r"Ray cluster at (\S+); the job's actors are in "
                                    r"namespace (\S+)", master_log)
        _kill_actor(address, namespace, "worker-0-0")
        pid = int(_found(r"worker-1 runs on 127\.0\.0\.1 \(pid (\d+)\)", master_log)[0])
        subprocess.run(["kill", "-9", str(pid)], check=True)
        runs = lambda role: _log(tmp_path / "job.log").count(f"{role} runs on")  # noqa: E731
        wait_for(lambda: runs("worker-0") >= 2 and runs("worker-1") >= 2, 240,
                 "worker-0 and worker-1 replaced")
        _kill_actor(address, namespace, "ps-0-0")
        wait_for(lambda: runs("ps-0") >= 2, 120, "ps-0 replaced")
        assert proc.wait(timeout=600) == 0, _log(tmp_path / "job.log")[-5000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded", summary.get("error")
    assert all(e["records"] == RECORDS and e["trained_never"] == 0 for e in summary["epochs"])
    exits = {(e["role"], e["reason"]) for e in summary["role_exits"]}
    assert {("worker-0", "actor_lost"), ("worker-1", "killed"), ("ps-0", "actor_lost")} <= exits
    assert summary["recovery"]["relaunches"] == {"worker-0": 1, "worker-1": 1, "ps-0": 1}
    assert "ps-0 lost its Ray actor (killed, or its node lost)" in _log(tmp_path / "job.log")
    wait_for(lambda: not marked_processes("EK_TEST_RAY_JOB", job), 60,
             "every process of the job and its cluster to end",
             left=lambda: marked_processes("EK_TEST_RAY_JOB", job))
