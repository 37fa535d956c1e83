"""A whole job on Kubernetes: `elastic-keras train --engine kubernetes` against a fake API
server (kmock, in its own process, driven over HTTP by the official client) and a fake kubelet
that runs each pod's container command as a local process.

What this covers: the submit command creating and following the master pod; the master, in
its "pod", creating PS and worker pods and their Secrets through the client, the roles taking
their private data from `secretKeyRef` env variables and advertising the downward-API pod IP;
the engine's list-and-watch of pods telling a deleted pod, an OOMKilled one, a preempted one
and a normal exit apart; the master's policy replacing them under new pod names (a
preemption without using the relaunch budget); pods deleted at the end.
What it does not: scheduling, resources and priorities (nothing enforces them), networking
(every pod IP is 127.0.0.1), owner-reference garbage collection and graceful deletion (kmock
has neither: a deleted pod is gone at once, while its process gets SIGTERM then SIGKILL).
"""

import json
import uuid

import pytest

from tests.conftest import ROOT
from tests.e2e.conftest import digits_records, start_cli, wait_for  # noqa: F401 - a fixture
from tests.engines.fake_cluster import FakeKubelet, KubeApi

RECORDS = 1437
NAMESPACE = "ml"


@pytest.fixture
def cluster(tmp_path):
    with KubeApi(tmp_path / "api") as api:
        kubelet = FakeKubelet(api.kubeconfig, NAMESPACE, tmp_path / "pods").start()
        try:
            yield api, kubelet
        finally:
            kubelet.stop()


def _log(kubelet, pod):
    path = kubelet.log_path(pod)
    return path.read_text(errors="replace") if path.exists() else ""


def _job_pods(core, job):
    pods = core.list_namespaced_pod(NAMESPACE).items
    return {p.metadata.name: p for p in pods
            if (p.metadata.labels or {}).get("elastic-keras/job") == job}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_job_on_kubernetes_survives_deleted_oomkilled_and_preempted_pods(
        cluster, digits_records, tmp_path):
    api, kubelet = cluster
    core = api.core_v1()
    job, out = f"k8s-{uuid.uuid4().hex[:8]}", tmp_path / "out"
    submit = start_cli(
        "train", "--engine", "kubernetes", "--image", "registry.example/train:1",
        "--namespace", NAMESPACE, "--kubeconfig", api.kubeconfig, "--job-name", job,
        "--model-zoo", ROOT / "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train", "--output", out,
        "--num-workers", 2, "--num-ps", 1, "--minibatch-size", 16, "--num-epochs", 8,
        "--relaunch-on-worker-failure", 1,
        "--num-minibatches-per-task", 8, "--checkpoint-dir", tmp_path / "ckpt",
        "--checkpoint-steps", 40, "--worker-resource-request", "cpu=1,memory=1Gi",
        log_path=tmp_path / "submit.log")
    try:
        for worker in (0, 1):
            wait_for(lambda: "Model built" in _log(kubelet, f"{job}-worker-{worker}"), 240,
                     f"worker-{worker} training")
        core.delete_namespaced_pod(f"{job}-worker-0", NAMESPACE)
        kubelet.oom_kill(f"{job}-worker-1")
        wait_for(lambda: "Registered" in _log(kubelet, f"{job}-ps-0")
                 and "Model built" in _log(kubelet, f"{job}-worker-0-r1"), 240,
                 "worker-0 replaced and training")
        core.delete_namespaced_pod(f"{job}-ps-0", NAMESPACE)
        wait_for(lambda: "Registered" in _log(kubelet, f"{job}-ps-0-r1"), 240,
                 "ps-0 replaced and registered")
        # worker-0 has used its one relaunch; a preemption is not its failure: relaunched.
        kubelet.preempt(f"{job}-worker-0-r1")
        wait_for(lambda: "Model built" in _log(kubelet, f"{job}-worker-0-r2"), 240,
                 "worker-0 relaunched after its preemption")
        assert submit.wait(timeout=600) == 0, (tmp_path / "submit.log").read_text()[-5000:]
    finally:
        if submit.poll() is None:
            submit.kill()
            submit.wait()
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded", summary.get("error")
    assert all(e["records"] == RECORDS and e["trained_never"] == 0 for e in summary["epochs"])
    exits = {(e["role"], e["reason"]) for e in summary["role_exits"]}
    assert {("worker-0", "deleted"), ("worker-1", "oom_killed"), ("ps-0", "deleted"),
            ("worker-0", "preempted")} <= exits
    assert f"Job {job} succeeded" in (tmp_path / "submit.log").read_text()
    # Every pod the master created is gone; the master pod ended Succeeded by itself.
    left = _job_pods(core, job)
    assert set(left) == {f"{job}-master"}, sorted(left)
    assert left[f"{job}-master"].status.phase == "Succeeded"
    wait_for(lambda: not kubelet.processes(), 60, "every pod's process to end",
             left=kubelet.processes)
    assert core.list_namespaced_secret(NAMESPACE).items == []
    # The worker pods asked for what the flags say.
    master_log = _log(kubelet, f"{job}-master")
    assert "Created pod" in master_log and f"{job}-worker-1-r1" in master_log
