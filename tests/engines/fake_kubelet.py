"""FakeKubelet: runs one namespace's pods of a fake API server as local processes.

See fake_cluster.py for what the fake cluster covers and what it leaves out.
"""

import dataclasses
import json
import logging
import os
import pathlib
import signal
import subprocess
import threading

import kubernetes
import urllib3

from tests.engines import pod_status
from tests.engines.pod_launch import LaunchError, launch_for

LOG = logging.getLogger(__name__)
# What a call to the API may raise when the server is slow, gone or answers an error.
API_ERRORS = (kubernetes.client.ApiException, urllib3.exceptions.HTTPError, OSError)
DEFAULT_GRACE_S = 30.0  # a pod's terminationGracePeriodSeconds when its spec has none


@dataclasses.dataclass(eq=False)
class _PodRun:
    """One start of one pod: its process and what to report when the process ends."""
    name: str
    uid: str
    container: str
    image: str
    process: subprocess.Popen
    grace_s: float
    started_at: str
    cause: str | None = None  # pod_status.OOM_KILLED or PREEMPTED once a test hook struck
    deleted: bool = False  # the pod is gone from the API: report nothing more
    kill_timer: threading.Timer | None = None
    reaper: threading.Thread | None = None


class FakeKubelet:
    """Runs the pods of `namespace` as local processes and patches their status.

    A thread lists then watches pods; each new pod's first container runs (argv and env from
    `pod_launch`) in its own session, cwd the current directory, output to
    `<log_dir>/<pod>.log`. Deleting a pod sends SIGTERM to its process group, then SIGKILL
    after its terminationGracePeriodSeconds (capped at `grace_cap_s`). Nothing restarts,
    whatever the restartPolicy.

    Args:
        kubeconfig: path of the fake API's kubeconfig (also given to every pod's process).
        namespace: the one namespace whose pods this kubelet runs.
        log_dir: where each pod's output goes (created if absent).
        grace_cap_s: the longest SIGTERM-to-SIGKILL wait, whatever the pod asks for.
        resync_s: a watch idle this long is dropped and the pods listed again.

    Example:
        with KubeApi() as api, FakeKubelet(api.kubeconfig, "job", tmp_path) as kubelet:
            api.core_v1().create_namespaced_pod("job", pod)
    """

    def __init__(self, kubeconfig, namespace, log_dir, *, grace_cap_s=5.0, resync_s=5.0):
        self.kubeconfig = str(kubeconfig)
        self.namespace = namespace
        self.log_dir = pathlib.Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self._grace_cap_s = grace_cap_s
        self._resync_s = resync_s
        self._watcher = self._core_v1()  # used by the watch thread only
        self._writer = self._core_v1()  # status patches and Secret reads, from any thread
        self._lock = threading.Lock()
        self._runs = {}  # pod name -> its latest _PodRun
        self._seen = {}  # pod name -> uid of each pod already handled
        self._held = {}  # pod name -> raw pod kept Pending by hold_pending()
        self._hold_prefixes = set()
        self._stopping = threading.Event()
        self._watch = None
        self._errors = []
        self._thread = threading.Thread(
            target=self._watch_loop, name=f"fake-kubelet-{namespace}", daemon=True)

    def start(self):
        """Starts watching; returns self."""
        self._thread.start()
        return self

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc_info):
        self.stop()

    @property
    def errors(self):
        """Unexpected exceptions in the kubelet's threads (bugs in the fake); empty if none."""
        return list(self._errors)

    def log_path(self, pod_name):
        """Where the output of pod `pod_name` goes."""
        return self.log_dir / f"{pod_name}.log"

    def processes(self):
        """{pod name: Popen} of the processes still running."""
        with self._lock:
            return {name: run.process for name, run in self._runs.items()
                    if run.process.poll() is None}

    def hold_pending(self, name_prefix):
        """Pods whose name starts with `name_prefix` and that have not started yet stay
        Pending with condition PodScheduled False, reason Unschedulable."""
        with self._lock:
            self._hold_prefixes.add(name_prefix)

    def release_pending(self, name_prefix):
        """Stops holding `name_prefix` and starts the pods it held."""
        with self._lock:
            self._hold_prefixes.discard(name_prefix)
            released = [self._held.pop(name) for name in list(self._held)
                        if name.startswith(name_prefix) and not self._is_held(name)]
        for pod in released:
            self._start(pod)

    def oom_kill(self, pod_name):
        """SIGKILLs the pod's process; it is reported Failed, reason OOMKilled, exit code 137."""
        run = self._live_run(pod_name)
        run.cause = pod_status.OOM_KILLED
        _signal_group(run.process, signal.SIGKILL)

    def preempt(self, pod_name):
        """Marks the pod with a DisruptionTarget condition, then SIGTERMs its process (SIGKILL
        after the grace period); it is reported Failed with reason Preempted."""
        run = self._live_run(pod_name)
        run.cause = pod_status.PREEMPTED
        self._patch(run.name, run.uid, pod_status.running(
            run.container, run.image, run.started_at, disrupted=True), run)
        self._terminate(run)

    def stop(self):
        """Kills every process this kubelet started (process groups, SIGKILL) and stops its
        threads. Safe to call more than once."""
        with self._lock:
            self._stopping.set()
            runs = list(self._runs.values())
        if self._watch is not None:
            self._watch.stop()
        for run in runs:
            if run.kill_timer is not None:
                run.kill_timer.cancel()
            _signal_group(run.process, signal.SIGKILL)
        for run in runs:
            if run.reaper is not None:
                run.reaper.join(timeout=10)
        if self._thread.is_alive():
            self._thread.join(timeout=self._resync_s + 10)

    def _core_v1(self):
        client = kubernetes.config.new_client_from_config(config_file=self.kubeconfig)
        return kubernetes.client.CoreV1Api(client)

    def _watch_loop(self):
        while not self._stopping.is_set():
            try:
                self._list_then_watch()
            except API_ERRORS as exc:  # a dropped or timed-out watch: list again
                LOG.debug("fake kubelet %s: watch ended: %r", self.namespace, exc)
            except Exception as exc:  # a bug in the fake: keep serving, tell the test
                LOG.exception("fake kubelet %s: watch loop failed", self.namespace)
                self._errors.append(exc)
            self._stopping.wait(0.2)

    def _list_then_watch(self):
        # kmock's list resourceVersion is "...", and objects may carry none: watch from
        # "now" instead. kmock replays every existing pod as ADDED when a watch starts, so
        # nothing created between the list and the watch is missed. It ignores server-side
        # watch timeouts, hence the client-side read timeout.
        listed = _raw(self._watcher.list_namespaced_pod, self.namespace)
        self._reconcile(listed.get("items") or [])
        self._watch = kubernetes.watch.Watch()
        if self._stopping.is_set():
            return
        for event in self._watch.stream(
                self._watcher.list_namespaced_pod, self.namespace, deserialize=False,
                _request_timeout=(5, self._resync_s)):
            if self._stopping.is_set() or event["type"] == "ERROR":
                return
            if event["type"] == "DELETED":
                self._forget(event["object"]["metadata"]["name"])
            else:
                self._admit(event["object"])

    def _reconcile(self, pods):
        for pod in pods:
            self._admit(pod)
        listed = {pod["metadata"]["name"] for pod in pods}
        with self._lock:
            gone = [name for name in self._seen if name not in listed]
        for name in gone:
            self._forget(name)

    def _admit(self, pod):
        metadata = pod["metadata"]
        name, uid = metadata["name"], metadata.get("uid", "")
        with self._lock:
            if self._seen.get(name) == uid:
                return
        if name in self._seen:  # the same name with a new uid: deleted, then created again
            self._forget(name)
        with self._lock:
            if self._stopping.is_set():
                return
            self._seen[name] = uid
            phase = (pod.get("status") or {}).get("phase")
            if metadata.get("deletionTimestamp") or phase in ("Succeeded", "Failed"):
                return
            hold = self._is_held(name)
            if hold:
                self._held[name] = pod
        if hold:
            self._patch(name, uid, pod_status.unschedulable(
                "0/1 nodes are available: held by the fake kubelet's hold_pending()"))
        else:
            self._start(pod)

    def _is_held(self, name):
        return any(name.startswith(prefix) for prefix in self._hold_prefixes)

    def _forget(self, name):
        with self._lock:
            self._seen.pop(name, None)
            self._held.pop(name, None)
            run = self._runs.get(name)
            if run is None or run.deleted:
                return
            run.deleted = True
        self._terminate(run)

    def _start(self, pod):
        name, uid = pod["metadata"]["name"], pod["metadata"].get("uid", "")
        container = pod["spec"]["containers"][0]
        try:
            launch = launch_for(pod, self.namespace, self.kubeconfig, self._read_object)
        except LaunchError as exc:
            self._patch(name, uid, pod_status.config_error(
                exc, container["name"], container.get("image", "")))
            return
        try:
            with open(self.log_path(name), "ab") as log:
                process = subprocess.Popen(
                    launch.argv, env=launch.env, cwd=os.getcwd(), stdin=subprocess.DEVNULL,
                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            self._patch(name, uid, pod_status.start_error(
                f"exec {launch.argv[0]!r}: {exc}", launch.container, launch.image))
            return
        grace_s = pod["spec"].get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
        run = _PodRun(name, uid, launch.container, launch.image, process,
                      min(float(grace_s), self._grace_cap_s), pod_status.now())
        run.reaper = threading.Thread(target=self._reap, args=(run,), daemon=True,
                                      name=f"fake-kubelet-reaper-{name}")
        with self._lock:
            self._runs[name] = run
            if self._stopping.is_set():  # stop() swept the runs while this one started
                _signal_group(process, signal.SIGKILL)
        run.reaper.start()

    def _reap(self, run):
        self._patch(run.name, run.uid, pod_status.running(
            run.container, run.image, run.started_at), run)
        returncode = run.process.wait()
        if run.kill_timer is not None:
            run.kill_timer.cancel()
        self._patch(run.name, run.uid, pod_status.terminated(
            run.container, run.image, run.started_at, returncode, run.cause), run)

    def _terminate(self, run):
        _signal_group(run.process, signal.SIGTERM)
        run.kill_timer = threading.Timer(
            run.grace_s, _signal_group, args=(run.process, signal.SIGKILL))
        run.kill_timer.daemon = True
        run.kill_timer.start()

    def _live_run(self, pod_name):
        live = self.processes()
        if pod_name not in live:
            raise ValueError(f"pod_name must name a pod whose process is running, one of "
                             f"{sorted(live)}. Received: pod_name={pod_name!r}")
        with self._lock:
            return self._runs[pod_name]

    def _read_object(self, kind, name):
        read = {"secret": self._writer.read_namespaced_secret,
                "configmap": self._writer.read_namespaced_config_map}[kind]
        try:
            return _raw(read, name, self.namespace)
        except kubernetes.client.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def _patch(self, name, uid, status, run=None):
        """Patches the pod's status, unless its run was deleted or the kubelet is stopping. The
        uid precondition keeps a late report off a new pod of the same name."""
        if self._stopping.is_set() or (run is not None and run.deleted):
            return
        body = {"metadata": {"uid": uid}, "status": status} if uid else {"status": status}
        try:
            self._writer.patch_namespaced_pod_status(
                name, self.namespace, body, _preload_content=False, _request_timeout=10)
        except kubernetes.client.ApiException as exc:
            if exc.status not in (404, 409):  # gone, or replaced by a pod of the same name
                LOG.warning("fake kubelet: status of pod %s not patched: %s", name, exc)
        except API_ERRORS as exc:
            LOG.warning("fake kubelet: status of pod %s not patched: %r", name, exc)


def _raw(call, *args):
    """The raw JSON of an API call, without the official client's models."""
    response = call(*args, _preload_content=False, _request_timeout=10)
    return json.loads(response.data)


def _signal_group(process, sig):
    """Sends `sig` to the process group of `process` while its leader still runs (never to
    a group whose leader has been reaped: its id may belong to someone else by then)."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        pass
