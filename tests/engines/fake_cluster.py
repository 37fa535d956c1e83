"""A fake Kubernetes cluster for engine tests: a real HTTP API server and a kubelet that runs
pods as local processes.

- `KubeApi` runs kmock's Kubernetes emulator (kube_api_server.py) in its own process on
  127.0.0.1 and writes a kubeconfig for it (plain HTTP, no auth).
- `FakeKubelet` (fake_kubelet.py) runs one namespace's pods as local processes and patches
  their status through that API.

What the fake covers:

- the API: create, get, list, watch, patch (status too), delete of any built-in resource, as
  an in-memory JSON store; `metadata.namespace`, `uid`, `creationTimestamp`, `generateName`
  and a pod's initial `status.phase: Pending` filled in on create; uid preconditions on patch;
- a pod's first container as a local process: `command` + `args` (a leading `python` is this
  interpreter) with `$(VAR)` expansion; env from values, `fieldRef` (status.podIP is
  127.0.0.1), `secretKeyRef` (`data` or `stringData`) and `configMapKeyRef`, plus `KUBECONFIG`
  pointing at the fake API; cwd the current directory; output to `<log_dir>/<pod>.log`;
- the pod lifecycle Pending -> Running -> Succeeded / Failed with container exit codes
  (128+N after signal N); deletion as SIGTERM, then SIGKILL after the pod's
  terminationGracePeriodSeconds (capped, 5 s by default);
- test hooks: `oom_kill` (OOMKilled, 137), `preempt` (DisruptionTarget, phase Failed, reason
  Preempted; the pod object stays), `hold_pending` / `release_pending` (Unschedulable).

What it does not cover:

- scheduling, nodes, resource requests and limits (nothing is enforced or accounted);
- networking: every pod IP is 127.0.0.1, there are no Services, DNS or ports per pod, so two
  pods must not listen on the same port;
- label and field selectors: kmock ignores them and returns every pod of the namespace;
- resourceVersion: lists answer "...", objects carry none, and a watch replays every existing
  object as ADDED before streaming changes; server-side watch timeouts are ignored;
- garbage collection by owner references, graceful deletion (deletionTimestamp, grace period
  in DeleteOptions: a deleted pod disappears from the API at once), finalizers' effects;
- patch semantics: every patch is a JSON merge (dicts merged, lists replaced, None removes);
  no strategic merge by key, no JSON patch, no server-side apply, no validation or defaults
  beyond those listed above;
- restarts: whatever the restartPolicy, a container never restarts (as with Never);
- containers beyond the first, init containers, images, volumes, probes, `workingDir`,
  `envFrom`, resourceFieldRef; processes left behind by a pod whose main process already
  exited are not killed.

Example:
    with KubeApi() as api, FakeKubelet(api.kubeconfig, "job", tmp_path / "logs") as kubelet:
        api.core_v1().create_namespaced_pod("job", pod_dict)
"""

import json
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import kubernetes

from tests.engines.fake_kubelet import FakeKubelet

__all__ = ["FakeKubelet", "KubeApi"]

HOST = "127.0.0.1"
SERVER_SCRIPT = pathlib.Path(__file__).with_name("kube_api_server.py")


class KubeApi:
    """kmock's Kubernetes emulator in its own process on 127.0.0.1, with a kubeconfig.

    Args:
        directory: where the kubeconfig, the port file and the server's log go; a temporary
            directory (removed on close) when None.
        start_timeout_s: how long the server may take to answer.

    Raises:
        RuntimeError: the server exited or did not answer in time (its log is in the message).

    Example:
        with KubeApi(tmp_path) as api:
            pods = api.core_v1().list_namespaced_pod("default")
    """

    def __init__(self, directory=None, *, start_timeout_s=30.0):
        self._owned_dir = None if directory else tempfile.mkdtemp(prefix="fake-kube-api-")
        self.directory = pathlib.Path(directory or self._owned_dir)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.log_path = self.directory / "kube-api.log"
        port_file = self.directory / "kube-api.port"
        port_file.unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, str(SERVER_SCRIPT), str(port_file)], stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + start_timeout_s
            self.port = self._wait_for_port(port_file, deadline)
            self.url = f"http://{HOST}:{self.port}"
            self._wait_until_answering(deadline)
        except BaseException:
            self.close()
            raise
        self.kubeconfig = self.directory / "kubeconfig"
        self.kubeconfig.write_text(json.dumps(_kubeconfig(self.url), indent=2))

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def client(self):
        """A new official-client `ApiClient` for this API."""
        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def core_v1(self):
        """A new `CoreV1Api` for this API."""
        return kubernetes.client.CoreV1Api(self.client())

    def close(self):
        """Kills the server process (and removes the temporary directory, if it made one)."""
        if self._process.poll() is None:
            self._process.kill()
        self._process.wait()
        if self._owned_dir is not None:
            shutil.rmtree(self._owned_dir, ignore_errors=True)

    def _wait_for_port(self, port_file, deadline):
        while not port_file.exists():
            self._check_alive(deadline)
            time.sleep(0.05)
        return int(port_file.read_text())

    def _wait_until_answering(self, deadline):
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            try:
                with opener.open(f"{self.url}/version", timeout=2) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            self._check_alive(deadline)
            time.sleep(0.05)

    def _check_alive(self, deadline):
        if self._process.poll() is not None:
            state = f"exited with code {self._process.returncode}"
        elif time.monotonic() > deadline:
            state = "did not answer in time"
        else:
            return
        raise RuntimeError(f"fake Kubernetes API server {state}; its log "
                           f"({self.log_path}):\n{self.log_path.read_text()[-4000:]}")


def _kubeconfig(url):
    """A kubeconfig (JSON is YAML) for `url`: one cluster, one context, a user with no auth."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": url}}],
        "users": [{"name": "fake", "user": {}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}],
        "current-context": "fake",
    }
