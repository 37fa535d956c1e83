"""The fake cluster itself (fake_cluster.py): real processes run as pods of a kmock API."""

import base64
import itertools
import signal

import kubernetes
import pytest

from tests.e2e.conftest import wait_for
from tests.engines.fake_cluster import FakeKubelet, KubeApi

pytestmark = pytest.mark.timeout(120)
WAIT_S = 30.0
_namespaces = itertools.count()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with KubeApi(tmp_path_factory.mktemp("kube-api")) as api:
        yield api


@pytest.fixture
def core(api):
    return api.core_v1()


@pytest.fixture
def namespace():
    """A namespace of its own per test: the kubelets of earlier tests never see its pods."""
    return f"fake-cluster-{next(_namespaces)}"


@pytest.fixture
def kubelet(api, namespace, tmp_path):
    kubelet = FakeKubelet(api.kubeconfig, namespace, tmp_path / "logs").start()
    yield kubelet
    kubelet.stop()
    assert kubelet.processes() == {}
    assert kubelet.errors == []


def python_pod(name, code, *args, env=(), grace_s=None):
    """A pod running `python -c code args...` with restartPolicy Never."""
    container = {"name": "main", "image": "python:3.11", "command": ["python"],
                 "args": ["-c", code, *args], "env": list(env)}
    spec = {"restartPolicy": "Never", "containers": [container]}
    if grace_s is not None:
        spec["terminationGracePeriodSeconds"] = grace_s
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


SLEEP = "import time; print('ready', flush=True); time.sleep(60)"


def wait_for_phase(core, namespace, name, *phases):
    """The pod (typed, so the official client's models accept its status) once its phase
    is one of `phases`."""
    def reached():
        pod = core.read_namespaced_pod(name, namespace)
        return pod if pod.status and pod.status.phase in phases else None
    return wait_for(reached, WAIT_S, f"pod {name} to reach phase {phases}")


def terminated_state(pod):
    return pod.status.container_statuses[0].state.terminated


def test_a_pod_that_prints_ends_succeeded_with_its_output_logged(core, namespace, kubelet):
    core.create_namespaced_pod(namespace, python_pod("hello", "print('hi')"))
    pod = wait_for_phase(core, namespace, "hello", "Succeeded", "Failed")
    assert pod.status.phase == "Succeeded"
    assert terminated_state(pod).exit_code == 0
    assert terminated_state(pod).reason == "Completed"
    assert kubelet.log_path("hello").read_text() == "hi\n"


def test_a_failing_pod_reports_its_exit_code(core, namespace, kubelet):
    core.create_namespaced_pod(namespace, python_pod("three", "import sys; sys.exit(3)"))
    pod = wait_for_phase(core, namespace, "three", "Succeeded", "Failed")
    assert pod.status.phase == "Failed"
    assert (terminated_state(pod).exit_code, terminated_state(pod).reason) == (3, "Error")


def test_env_from_a_secret_fields_and_expansion_reach_the_process(api, core, namespace, kubelet):
    core.create_namespaced_secret(namespace, {
        "metadata": {"name": "creds"},
        "data": {"token": base64.b64encode(b"s3cret").decode()},
        "stringData": {"plain": "in-clear"}})
    env = [
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "token"}}},
        {"name": "PLAIN", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "plain"}}},
        {"name": "PORT", "value": "7000"},
        {"name": "ADDRESS", "value": "$(POD_IP):$(PORT)"},
    ]
    code = ("import os, sys; print(sys.argv[1:], [os.environ[k] for k in "
            "('POD_NAME', 'TOKEN', 'PLAIN', 'ADDRESS', 'KUBECONFIG')])")
    core.create_namespaced_pod(namespace, python_pod(
        "envy", code, "$(POD_IP):$(PORT)", "$(UNDEFINED)", "$$(PORT)", env=env))
    assert wait_for_phase(core, namespace, "envy", "Succeeded", "Failed").status.phase == \
        "Succeeded"
    expected = (["127.0.0.1:7000", "$(UNDEFINED)", "$(PORT)"],
                ["envy", "s3cret", "in-clear", "127.0.0.1:7000", str(api.kubeconfig)])
    assert kubelet.log_path("envy").read_text() == f"{expected[0]} {expected[1]}\n"


def test_a_pod_missing_its_secret_stays_pending_with_a_config_error(core, namespace, kubelet):
    env = [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "absent", "key": "k"}}}]
    core.create_namespaced_pod(namespace, python_pod("orphan", "print('ran')", env=env))

    def waiting():
        statuses = core.read_namespaced_pod("orphan", namespace).status.container_statuses
        return statuses and statuses[0].state.waiting
    assert wait_for(waiting, WAIT_S, "a waiting container").reason == \
        "CreateContainerConfigError"
    assert core.read_namespaced_pod("orphan", namespace).status.phase == "Pending"
    assert not kubelet.log_path("orphan").exists()


def wait_running(core, namespace, kubelet, name):
    """The Popen of pod `name` once it runs and has printed 'ready'."""
    wait_for_phase(core, namespace, name, "Running")
    wait_for(lambda: kubelet.log_path(name).exists()
             and "ready" in kubelet.log_path(name).read_text(), WAIT_S, f"{name} to be ready")
    return kubelet.processes()[name]


def test_deleting_a_running_pod_kills_its_process(core, namespace, kubelet):
    core.create_namespaced_pod(namespace, python_pod("sleeper", SLEEP))
    process = wait_running(core, namespace, kubelet, "sleeper")
    assert core.read_namespaced_pod("sleeper", namespace).status.pod_ip == "127.0.0.1"
    core.delete_namespaced_pod("sleeper", namespace)
    wait_for(lambda: process.poll() is not None, WAIT_S, "the deleted pod's process to end")
    assert process.returncode == -signal.SIGTERM
    assert "sleeper" not in kubelet.processes()


def test_a_pod_ignoring_sigterm_is_killed_after_its_grace_period(core, namespace, kubelet):
    code = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + SLEEP
    core.create_namespaced_pod(namespace, python_pod("stubborn", code, grace_s=1))
    process = wait_running(core, namespace, kubelet, "stubborn")
    core.delete_namespaced_pod("stubborn", namespace)
    wait_for(lambda: process.poll() is not None, WAIT_S, "the stubborn process to end")
    assert process.returncode == -signal.SIGKILL


def test_oom_kill_reports_oomkilled(core, namespace, kubelet):
    core.create_namespaced_pod(namespace, python_pod("hog", SLEEP))
    wait_running(core, namespace, kubelet, "hog")
    kubelet.oom_kill("hog")
    pod = wait_for_phase(core, namespace, "hog", "Succeeded", "Failed")
    assert pod.status.phase == "Failed"
    assert (terminated_state(pod).exit_code, terminated_state(pod).reason) == (137, "OOMKilled")


def test_preempt_reports_a_disruption(core, namespace, kubelet):
    core.create_namespaced_pod(namespace, python_pod("victim", SLEEP))
    wait_running(core, namespace, kubelet, "victim")
    kubelet.preempt("victim")
    pod = wait_for_phase(core, namespace, "victim", "Succeeded", "Failed")
    assert (pod.status.phase, pod.status.reason) == ("Failed", "Preempted")
    disruptions = [c for c in pod.status.conditions if c.type == "DisruptionTarget"]
    assert [(c.status, c.reason) for c in disruptions] == [("True", "PreemptionByScheduler")]
    assert terminated_state(pod).exit_code == 128 + signal.SIGTERM


def test_held_pods_stay_pending_until_released(core, namespace, kubelet):
    kubelet.hold_pending("held-")
    core.create_namespaced_pod(namespace, python_pod("held-0", "print('late')"))

    def unschedulable():
        conditions = core.read_namespaced_pod("held-0", namespace).status.conditions or []
        return [c for c in conditions if c.type == "PodScheduled" and c.status == "False"]
    assert wait_for(unschedulable, WAIT_S, "PodScheduled False")[0].reason == "Unschedulable"
    assert "held-0" not in kubelet.processes()
    assert not kubelet.log_path("held-0").exists()
    kubelet.release_pending("held-")
    assert wait_for_phase(core, namespace, "held-0", "Succeeded", "Failed").status.phase == \
        "Succeeded"


def test_hooks_name_the_pod_they_could_not_find(kubelet):
    with pytest.raises(ValueError, match="Received: pod_name='nobody'"):
        kubelet.oom_kill("nobody")


def test_a_second_client_watch_sees_added_modified_deleted(api, namespace, kubelet):
    core = kubernetes.client.CoreV1Api(api.client())
    kubelet.hold_pending("watched")  # so that the watch starts before the pod runs
    core.create_namespaced_pod(namespace, python_pod("watched", "print('seen')"))
    seen = []
    stream = kubernetes.watch.Watch().stream(
        core.list_namespaced_pod, namespace, _request_timeout=(5, WAIT_S))
    for event in stream:  # a silent stream raises ReadTimeoutError: the test fails
        seen.append((event["type"], event["object"].status.phase))
        if len(seen) == 1:
            kubelet.release_pending("watched")
        if seen[-1] == ("MODIFIED", "Succeeded"):
            core.delete_namespaced_pod("watched", namespace)
        if event["type"] == "DELETED":
            break
    assert seen[0] == ("ADDED", "Pending")
    assert ("MODIFIED", "Running") in seen
    assert seen[-2:] == [("MODIFIED", "Succeeded"), ("DELETED", "Succeeded")]


def test_the_api_server_listens_on_loopback_only(api):
    listening = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            rows = [line.split() for line in f.readlines()[1:]]
        listening += [row[1] for row in rows if row[3] == "0A"]  # 0A: LISTEN
    port = f"{api.port:04X}"
    assert [address for address in listening if address.endswith(f":{port}")] == \
        [f"0100007F:{port}"]
