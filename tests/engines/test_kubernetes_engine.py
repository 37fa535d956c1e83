"""The Kubernetes engine (kubernetes_pods.py) against a fake API server (kmock, driven by the
official client) and a fake kubelet running each pod's command as a local process: what it
reports for each way a pod can end, and what it leaves behind. See test_kubernetes_job.py
for what the fake covers and what it does not."""

import dataclasses
import itertools

import pytest

from elastic_keras.common.engine_options import ClusterOptions
from elastic_keras.master.instance_manager import ExitReason, RoleId, RoleSpec, RoleType
from elastic_keras.master.instance_manager.kubernetes_pods import (
    KubernetesEngineConfig, KubernetesInstanceManager,
)
from tests.e2e.conftest import wait_for
from tests.engines.fake_cluster import FakeKubelet, KubeApi

pytestmark = pytest.mark.timeout(180)
WAIT_S = 60.0
_jobs = itertools.count()


@pytest.fixture(scope="module")
def api(tmp_path_factory):
    with KubeApi(tmp_path_factory.mktemp("kube-api")) as api:
        yield api


@pytest.fixture
def cluster(api, tmp_path):
    """(engine factory, kubelet, namespace): a namespace of its own per test."""
    namespace = f"engine-{next(_jobs)}"
    kubelet = FakeKubelet(api.kubeconfig, namespace, tmp_path / "pods").start()
    engines = []

    def engine(**options):
        cluster_options = ClusterOptions(namespace=namespace, image="test:1",
                                         kubeconfig=str(api.kubeconfig), **options)
        lines = []
        made = KubernetesInstanceManager(
            KubernetesEngineConfig(f"job{namespace[-3:].strip('-')}", cluster_options,
                                   log_dir=str(tmp_path / "logs")),
            on_line=lambda role, line: lines.append((role, line)))
        made.lines = lines
        engines.append(made)
        return made

    yield engine, kubelet, namespace, api.core_v1()
    for made in engines:
        made.stop_all(1)
    kubelet.stop()


def _spec(index, seconds, code=0, files=()):
    return RoleSpec(RoleId(RoleType.WORKER, index), "tests.engines.sleepy_role",
                    (str(seconds), str(code)), files=files)


def _exits(engine, count):
    found = []
    wait_for(lambda: found.extend(engine.poll()) or len(found) >= count, WAIT_S,
             f"{count} role exits", left=lambda: found)
    return {e.role.index: e for e in found}


def test_exit_codes_come_back_and_each_launchs_secret_goes_with_it(cluster):
    make, kubelet, namespace, core = cluster
    engine = make()
    engine.start(_spec(0, 0, 0))
    engine.start(_spec(1, 0, 7, files=(("--secret-file", b"x"),)))
    exits = _exits(engine, 2)
    assert (exits[0].exit_code, exits[0].reason) == (0, ExitReason.SUCCEEDED)
    assert (exits[1].exit_code, exits[1].reason) == (7, ExitReason.CRASHED)
    assert engine.running() == []
    # A launch's Secret goes with it.
    wait_for(lambda: not core.list_namespaced_secret(namespace).items, WAIT_S, "secrets gone")


def test_deleted_oomkilled_and_preempted_pods_are_told_apart(cluster):
    make, kubelet, namespace, core = cluster
    engine = make()
    for index in range(3):
        engine.start(_spec(index, 60))
    job = engine._config.job_name
    wait_for(lambda: len(kubelet.processes()) == 3, WAIT_S, "3 pods running")
    core.delete_namespaced_pod(f"{job}-worker-0", namespace)
    kubelet.oom_kill(f"{job}-worker-1")
    kubelet.preempt(f"{job}-worker-2")
    exits = _exits(engine, 3)
    assert [exits[i].reason for i in range(3)] == [
        ExitReason.DELETED, ExitReason.OOM_KILLED, ExitReason.PREEMPTED]
    assert "OOMKilled" in exits[1].describe()
    engine.start(_spec(0, 60))  # a relaunch: a new pod name
    wait_for(lambda: f"{job}-worker-0-r1" in kubelet.processes(), WAIT_S, "the relaunch")


def test_a_pod_never_scheduled_ends_after_the_pending_timeout(cluster):
    make, kubelet, namespace, core = cluster
    engine = make(pending_timeout=2.0)
    kubelet.hold_pending(f"{engine._config.job_name}-worker-0")
    engine.start(_spec(0, 60))
    exit_ = _exits(engine, 1)[0]
    assert exit_.reason == ExitReason.UNSCHEDULABLE
    assert "not scheduled within --pending-timeout" in exit_.describe()


def test_stop_asks_the_role_to_leave_and_stop_all_deletes_every_pod(cluster):
    make, kubelet, namespace, core = cluster
    engine = make(keep_failed_pods=True)
    engine.start(_spec(0, 60))
    engine.start(_spec(1, 0, 5))
    job = engine._config.job_name
    wait_for(lambda: "up" in (kubelet.log_path(f"{job}-worker-0").read_text()
                              if kubelet.log_path(f"{job}-worker-0").exists() else ""),
             WAIT_S, "worker-0 up")
    engine.stop(RoleId(RoleType.WORKER, 0), grace_s=5)
    exits = _exits(engine, 2)
    assert exits[0].reason != ExitReason.DELETED and exits[1].exit_code == 5
    engine.stop_all(1)
    left = {p.metadata.name for p in core.list_namespaced_pod(namespace).items}
    assert left == {f"{job}-worker-1"}  # the failed one, kept for its logs
    wait_for(lambda: not kubelet.processes(), WAIT_S, "no process left")


def test_a_killed_role_is_reported_killed(cluster):
    make, kubelet, namespace, core = cluster
    engine = make()
    engine.start(_spec(0, 60))
    wait_for(lambda: kubelet.processes(), WAIT_S, "the pod running")
    engine.kill(RoleId(RoleType.WORKER, 0))
    exit_ = _exits(engine, 1)[0]
    assert exit_.exit_code < 0 and exit_.reason == ExitReason.KILLED


def test_an_engine_without_an_image_is_refused():
    from elastic_keras.common.errors import ConfigError
    with pytest.raises(ConfigError, match="needs --image"):
        KubernetesInstanceManager(KubernetesEngineConfig(
            "job", dataclasses.replace(ClusterOptions(), image="")))
