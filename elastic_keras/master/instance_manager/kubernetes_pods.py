"""Roles as Kubernetes pods, created by the master through the official client.

Each launch of a role is a pod (`<job>-<role>`, a relaunch `<job>-<role>-r<n>`: a deleted pod
may linger as Terminating) with `restartPolicy: Never`, owned by the master's pod when the
master runs in one (deleting it deletes the job), and a Secret holding the launch's private
data. One watch follows the job's pods: list, then watch from the list's resourceVersion,
listing again when the stream ends, fails or is too old (410), and at least every
`RESYNC_S`; pods are also filtered by label here, not only by the server. What ended a pod is
told apart: its exit code, OOMKilled, preempted or evicted, deleted by someone else, or not
scheduled within `--pending-timeout`. Role output is followed from the pod logs into the
master's console and `<output>/logs/<role>.log`. At the end every pod the engine created is
deleted (failed ones kept with `--keep-failed-pods`).
"""

import collections
import dataclasses
import logging
import os
import signal
import threading
import time

from elastic_keras.common.engine_options import ClusterOptions
from elastic_keras.master.instance_manager.api import ExitReason, RoleExit
from elastic_keras.master.instance_manager.kube_client import api_exception, core_api
from elastic_keras.master.instance_manager.pod_logs import follow_log
from elastic_keras.master.instance_manager.pod_manifests import LABEL_JOB, PodMaker
from elastic_keras.master.instance_manager.watched import WatchedInstanceManager

logger = logging.getLogger(__name__)

RESYNC_S = 10.0       # a watch stream is ended and the pods listed again this often
STOP_WAIT_S = 30.0    # after a stop's grace, how long its pod gets to be seen gone
_DISRUPTIONS = ("PreemptionByScheduler", "PreemptionByKubeScheduler", "EvictionByEvictionAPI",
                "DeletionByTaintManager", "TerminationByKubelet")


@dataclasses.dataclass(frozen=True)
class KubernetesEngineConfig:
    """How the Kubernetes engine runs a job's roles.

    Attributes:
        job_name: names and labels the pods.
        options: the job's `ClusterOptions` (namespace, image, resources, ...).
        master_pod: the master's own pod (its owner reference), if it runs in one.
        num_workers: for `--worker-pod-priority high=F`.
        log_dir: where role logs go, or "" for none.
    """

    job_name: str = "job"
    options: ClusterOptions = ClusterOptions()
    master_pod: str = ""
    num_workers: int = 1
    log_dir: str = ""

    @classmethod
    def from_job(cls, job):
        return cls(job.job_name, job.cluster, os.environ.get("POD_NAME", ""),
                   job.num_workers, os.path.join(job.output, "logs") if job.output else "")


@dataclasses.dataclass
class _Launch:
    spec: object
    pod: str
    created: float
    stopping: bool = False
    running: bool = False
    unschedulable: str = ""
    ended: "RoleExit | None" = None


class KubernetesInstanceManager(WatchedInstanceManager):
    """Runs each role as a pod in `config.options.namespace`.

    Args:
        config: a `KubernetesEngineConfig`.
        on_line: called as `on_line(role_name, line)` for every line a role prints.

    Raises:
        ConfigError: no --image, a job name that cannot name pods, bad pod flags, or no
            usable client configuration.
    """

    config_type = KubernetesEngineConfig

    def __init__(self, config=None, on_line=None):
        super().__init__()
        config = config or KubernetesEngineConfig()
        self._config = config
        self._maker = PodMaker(config.job_name, config.options)
        self._namespace = config.options.namespace
        self._api = core_api(config.options.kubeconfig)
        self._on_line = on_line or (lambda name, line: None)
        self._launches = collections.Counter()  # role name -> launches so far
        self._by_pod = {}                       # pod name -> `_Launch`, ended ones too
        self._closed = threading.Event()
        self._watcher = None

    # -- orders ----------------------------------------------------------------------------

    def start(self, spec):
        with self._lock:
            if spec.name in self._current:
                raise ValueError(f"Role {spec.name} is already running.")
            launch = self._launches[spec.name]
            self._launches[spec.name] += 1
        if self._watcher is None:
            self._find_owner()
            self._watcher = threading.Thread(target=self._watch, name="pod-watch", daemon=True)
            self._watcher.start()
        pod, secret = self._maker.role_pod(spec, launch, self._config.num_workers)
        name = pod["metadata"]["name"]
        with self._lock:
            entry = _Launch(spec, name, time.monotonic())
            self._current[spec.name] = self._by_pod[name] = entry
        try:
            if secret is not None:
                self._api.create_namespaced_secret(self._namespace, secret)
            self._api.create_namespaced_pod(self._namespace, pod)
        except api_exception() as exc:
            with self._lock:
                self._current.pop(spec.name, None)
                self._by_pod.pop(name, None)
            raise RuntimeError(f"Cannot create pod {name}: {exc.status} {exc.reason}: "
                               f"{(exc.body or '')[:500]}") from exc
        logger.info("Created pod %s for %s", name, spec.name)

    def _find_owner(self):
        """Owner references to the master's pod, so that deleting it deletes the job."""
        if not self._config.master_pod:
            return
        try:
            me = self._api.read_namespaced_pod(self._config.master_pod, self._namespace)
        except api_exception() as exc:
            logger.warning("Cannot read the master's pod %s (%s): the job's pods will not be "
                           "owned by it", self._config.master_pod, exc.reason)
            return
        if me.metadata.uid:
            self._maker.owner = {"apiVersion": "v1", "kind": "Pod", "name": me.metadata.name,
                                 "uid": me.metadata.uid, "controller": True,
                                 "blockOwnerDeletion": True}
        else:
            logger.warning("The master's pod %s has no uid: the job's pods will not be owned "
                           "by it", self._config.master_pod)

    def poll(self):
        self._check_pending()
        return super().poll()

    def stop(self, role, grace_s):
        self._delete_current([role.name], grace_s)

    def kill(self, role):
        for launch in self._claim([role.name]):
            self._delete_pod(launch.pod, 0)

    def stop_all(self, grace_s):
        with self._lock:
            names = list(self._current)
        self._delete_current(names, grace_s)
        self._closed.set()
        with self._lock:
            leftovers = [(l.pod, l.ended) for l in self._by_pod.values()]
        for pod, ended in leftovers:
            keep = (self._config.options.keep_failed_pods and ended is not None
                    and not ended.succeeded)
            if not keep:
                self._delete_pod(pod, 0)
            self._delete_secret(pod)

    def _delete_current(self, names, grace_s):
        """Deletes the pods of roles `names` with `grace_s` seconds to stop, and waits
        until each is seen ended (its exit recorded as seen, or as killed)."""
        launches = self._claim(names)
        for launch in launches:
            self._delete_pod(launch.pod, grace_s)
        self._wait_ended(launches, grace_s + STOP_WAIT_S)
        with self._lock:
            for launch in launches:
                if launch.ended is None:  # never seen gone: taken as killed
                    self._end(launch, RoleExit(launch.spec, -signal.SIGKILL))

    def _delete_pod(self, name, grace_s):
        try:
            self._api.delete_namespaced_pod(name, self._namespace,
                                            grace_period_seconds=int(grace_s))
        except api_exception() as exc:
            if exc.status != 404:
                logger.warning("Cannot delete pod %s: %s %s", name, exc.status, exc.reason)

    def _delete_secret(self, name):
        try:
            self._api.delete_namespaced_secret(name, self._namespace)
        except api_exception() as exc:
            if exc.status != 404:
                logger.warning("Cannot delete secret %s: %s %s", name, exc.status, exc.reason)

    # -- what the cluster says ---------------------------------------------------------------

    def _check_pending(self):
        timeout = self._config.options.pending_timeout
        if not timeout:
            return
        now = time.monotonic()
        with self._lock:
            late = [l for l in self._current.values()
                    if not l.running and not l.stopping and now - l.created > timeout]
            for launch in late:
                launch.stopping = True
                self._end(launch, RoleExit(launch.spec, -signal.SIGKILL,
                                           ExitReason.UNSCHEDULABLE, launch.unschedulable))
        for launch in late:
            self._delete_pod(launch.pod, 0)

    def _watch(self):
        """Lists the job's pods, then watches them, for as long as the engine lives."""
        from kubernetes import watch
        selector = f"{LABEL_JOB}={self._config.job_name}"
        while not self._closed.is_set():
            try:
                listed = self._api.list_namespaced_pod(self._namespace, label_selector=selector)
                self._reconcile(listed.items)
                version = listed.metadata.resource_version
                kwargs = {"label_selector": selector, "timeout_seconds": int(RESYNC_S),
                          "_request_timeout": (10, RESYNC_S)}
                if version and version != "...":  # a test server may answer "..."
                    kwargs["resource_version"] = version
                stream = watch.Watch()
                for event in stream.stream(self._api.list_namespaced_pod, self._namespace,
                                           **kwargs):
                    if self._closed.is_set() or event["type"] == "ERROR":
                        break  # ERROR: typically 410, the version is too old: list again
                    self._seen(event["object"], deleted=event["type"] == "DELETED")
                stream.stop()
            except Exception as exc:  # a dropped connection, a read timeout, 410: list again
                if not self._closed.is_set():
                    logger.debug("Pod watch ended (%s: %s); listing again",
                                 type(exc).__name__, exc)
                    self._closed.wait(0.5)

    def _reconcile(self, pods):
        mine = {p.metadata.name: p for p in pods if self._is_mine(p)}
        for pod in mine.values():
            self._seen(pod)
        with self._lock:
            gone = [l for l in self._current.values()
                    if l.pod not in mine and (l.running or l.stopping
                                              or time.monotonic() - l.created > RESYNC_S)]
        for launch in gone:  # deleted while no watch was open
            self._gone(launch, None)

    def _is_mine(self, pod):
        labels = pod.metadata.labels or {}
        return labels.get(LABEL_JOB) == self._config.job_name

    def _seen(self, pod, deleted=False):
        if not self._is_mine(pod):
            return
        with self._lock:
            launch = self._by_pod.get(pod.metadata.name)
        if launch is None or launch.ended is not None:
            return
        status = pod.status
        phase = status.phase if status else None
        if deleted:
            self._gone(launch, pod)
        elif phase in ("Succeeded", "Failed"):
            with self._lock:
                self._end(launch, _exit_of(launch.spec, pod))
        elif phase == "Running" and not launch.running:
            launch.running = True
            follow_log(self._api, self._namespace, launch.pod, launch.spec.name,
                       self._config.log_dir, self._on_line, self._closed)
        elif phase == "Pending":
            launch.unschedulable = _unschedulable(status) or launch.unschedulable

    def _gone(self, launch, pod):
        """The pod of `launch` no longer exists."""
        ended = _exit_of(launch.spec, pod) if pod is not None else None
        with self._lock:
            if launch.ended is not None:
                return
            if ended is None or ended.exit_code is None:
                code = -signal.SIGTERM if launch.stopping else -signal.SIGKILL
                told = None if launch.stopping else ExitReason.DELETED
                ended = RoleExit(launch.spec, code, told)
            self._end(launch, ended)

    def _end(self, launch, ended):
        """Records that `launch` ended (the lock held), and deletes its Secret."""
        if super()._end(launch, ended):
            threading.Thread(target=self._delete_secret, args=(launch.pod,),
                             daemon=True).start()


def _exit_of(spec, pod):
    """The `RoleExit` a pod's status tells, with exit_code None when it tells none."""
    status = pod.status
    terminated = None
    for container in (status.container_statuses or []) if status else []:
        if container.state and container.state.terminated:
            terminated = container.state.terminated
    code = None
    if terminated is not None:
        code = terminated.exit_code
        code = -(code - 128) if 128 < code <= 128 + 64 else code  # died of a signal
    elif status and status.phase == "Succeeded":
        code = 0
    told = None
    disrupted = any(c.type == "DisruptionTarget" and c.status == "True"
                    and c.reason in _DISRUPTIONS for c in (status.conditions or [])
                    ) if status else False
    if terminated is not None and terminated.reason == "OOMKilled":
        told = ExitReason.OOM_KILLED
    elif disrupted or (status and status.reason in ("Preempted", "Evicted")):
        told = ExitReason.PREEMPTED
    if code is None and told is None:
        return None if not status or status.phase != "Failed" else RoleExit(spec, 1)
    detail = (status.message or "") if status else ""
    return RoleExit(spec, -signal.SIGKILL if code is None else code, told, detail[:200])


def _unschedulable(status):
    for condition in status.conditions or [] if status else []:
        if (condition.type == "PodScheduled" and condition.status == "False"
                and condition.reason == "Unschedulable"):
            return (condition.message or "unschedulable")[:200]
    return ""
