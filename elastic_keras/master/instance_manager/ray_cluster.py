"""The Ray engine's cluster: the one `--ray-address` names, or one on this machine for the
job.

`connect` joins a cluster as the job's driver. Without `--ray-address` it first starts a
`LocalRayCluster`: `ray start --head --block` under a keeper process, which asks the kernel
for SIGTERM when the master dies and becomes the subreaper of everything Ray starts, so that
Ray's agents, which outlive a killed head and ignore SIGTERM, are its children too. When the
master stops the cluster, or dies, the keeper stops the head and then SIGKILLs whatever is
left under it: no Ray process outlives the job. The cluster binds 127.0.0.1 only.

`python -m elastic_keras.master.instance_manager.ray_cluster PARENT_PID PORT NUM_CPUS READY`
runs the keeper; it creates the file READY once the head is up.
"""

import ctypes
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.tls import is_loopback

logger = logging.getLogger(__name__)

READY_LINE = b"Ray runtime started"  # what `ray start` prints once the head is up
HEAD_STOP_S = 10.0      # the head's own shutdown gets this long before the keeper kills
START_TIMEOUT_S = 120.0
REAP_S = 30.0
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "disabled",
           "RAY_USAGE_STATS_ENABLED": "0"}


class LocalRayCluster:
    """A head node on 127.0.0.1 kept by a child process; `address` is its GCS address.

    Args:
        num_cpus: the CPUs the cluster offers (default: this machine's).
        log_path: where the keeper and the head write their output.
    """

    def __init__(self, num_cpus=None, log_path=os.devnull):
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        self.log_path = log_path
        self._ready_dir = tempfile.mkdtemp(prefix="elastic-keras-ray-")
        self._ready = os.path.join(self._ready_dir, "ready")
        with open(log_path, "ab") as log:
            self._keeper = subprocess.Popen(
                [sys.executable, "-m", __name__, str(os.getpid()), str(port),
                 str(num_cpus if num_cpus is not None else os.cpu_count() or 1), self._ready],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env={**os.environ, **RAY_ENV}, start_new_session=True,
            )

    def wait_ready(self, timeout_s=START_TIMEOUT_S):
        """Returns once the head says every process of it runs.

        Raises:
            ConfigError: the head exited or was not up within `timeout_s`.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._keeper.poll() is None:
            if os.path.exists(self._ready):
                return
            time.sleep(0.1)
        exited = self._keeper.poll()
        self.stop()
        raise ConfigError(
            f"The job's local Ray cluster did not start (see {self.log_path}). Received: " + (
                f"its head exited (code {exited})" if exited is not None else
                f"not up at {self.address} after {timeout_s:.0f} s"))

    def alive(self):
        """Whether the cluster still runs (its head stops whole when one of its processes
        dies)."""
        return self._keeper.poll() is None

    def stop(self, timeout_s=HEAD_STOP_S + 20):
        """Stops the head and every process under it; returns when the keeper has exited."""
        if self._keeper.poll() is None:
            self._keeper.send_signal(signal.SIGTERM)
        try:
            self._keeper.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._keeper.kill()
            self._keeper.wait()
        shutil.rmtree(self._ready_dir, ignore_errors=True)


def connect(address, namespace, log_dir=""):
    """(the `ray` module, connected to the cluster at `address` in `namespace`; the job's own
    `LocalRayCluster`, logging to `log_dir`/ray.log, when `address` is empty, else None).

    Raises:
        ConfigError: Ray is not installed, or the cluster cannot be reached or started.
    """
    given = address
    if not given:
        os.environ.update({k: v for k, v in RAY_ENV.items() if k not in os.environ})
    else:
        _check_reachable(given)
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray: pip install 'elastic-keras[ray]'. "
                          "Received: no module named ray") from None
    cluster = None
    try:
        if not given:
            _loopback_only()
            if log_dir:
                os.makedirs(log_dir, exist_ok=True)
            cluster = LocalRayCluster(log_path=os.path.join(log_dir, "ray.log") if log_dir
                                      else os.devnull)
            cluster.wait_ready()
            address = cluster.address
        ray.init(address=address, namespace=namespace,
                 log_to_driver=False, logging_level=logging.WARNING)
    except BaseException as exc:  # Ctrl-C too: the cluster goes with the failed start
        if cluster is not None:
            cluster.stop()
        if isinstance(exc, ConfigError) or not isinstance(exc, Exception):
            raise
        raise ConfigError(f"Cannot connect to the Ray cluster at {address} ({exc}). "
                          f"Received: --ray-address {given!r}") from exc
    logger.info("Ray cluster at %s; the job's actors are in namespace %s", address, namespace)
    return ray, cluster


def check_host_reaches_nodes(host, nodes, here):
    """Roles bound to a loopback `--host` reach each other on one machine only: every live
    node (`nodes`, as `ray.nodes()` lists them) must be this one (its address `here`).

    Raises:
        ConfigError: a node is another machine while `host` is a loopback address.
    """
    if not is_loopback(host):
        return
    others = sorted({node["NodeManagerAddress"] for node in nodes if node.get("Alive")
                     and node["NodeManagerAddress"] != here
                     and not is_loopback(node["NodeManagerAddress"])})
    if others:
        raise ConfigError(
            f"--host {host} is reachable from this machine alone, but the Ray cluster has "
            f"nodes elsewhere ({', '.join(others)}): give --host 0.0.0.0 --tls auto. "
            f"Received: --host {host}")


def _loopback_only():
    """Keeps this driver on 127.0.0.1 for the job's local cluster: Ray reads
    RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER when it is imported, and otherwise resolves 127.0.0.1
    to this machine's network address, where the cluster does not listen. When Ray was
    imported before the variable was set (by a model module, say), its constant is set."""
    constants = sys.modules.get("ray._private.ray_constants")
    if getattr(constants, "ENABLE_RAY_CLUSTER", False):
        constants.ENABLE_RAY_CLUSTER = False


def _check_reachable(address):
    """A head's host:port answers (Ray itself retries an unreachable one for minutes).

    Raises:
        ConfigError: it does not answer within 10 s.
    """
    host, _, port = address.rpartition(":")
    if address == "auto" or "://" in address or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()
    except OSError as exc:
        raise ConfigError(f"--ray-address {address}: no Ray head answers there ({exc}). "
                          f"Received: --ray-address {address}") from None


def _free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _descendants(pid):
    """Every live process under `pid`, from each process's parent in /proc/*/stat."""
    children = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # it ended while we looked
        children.setdefault(parent, []).append(int(entry))
    found, queue = [], [pid]
    while queue:
        below = children.get(queue.pop(), [])
        found += below
        queue += below
    return found


def _reap_all():
    """SIGKILLs every process under this one until none is left (or one cannot die: a
    process stuck in the kernel is left after `REAP_S`)."""
    deadline = time.monotonic() + REAP_S
    while True:
        left = _descendants(os.getpid())
        if not left or time.monotonic() > deadline:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:  # collect the dead (orphans are ours: this process is their subreaper)
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        time.sleep(0.05)


def _relay(stream, ready):
    """Copies the head's output to this process's, and marks it ready once it says so."""
    for raw in stream:
        sys.stdout.buffer.write(raw)
        sys.stdout.buffer.flush()
        if READY_LINE in raw:
            open(ready, "wb").close()


def _keep(parent, port, num_cpus, ready):
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    for option, value, what in ((_PR_SET_PDEATHSIG, signal.SIGTERM, "stop with the master"),
                                (_PR_SET_CHILD_SUBREAPER, 1, "reap what Ray leaves")):
        if libc.prctl(option, int(value), 0, 0, 0) != 0:
            print(f"The job's Ray cluster cannot {what} (prctl: "
                  f"{os.strerror(ctypes.get_errno())})", flush=True)
    # A plain list, not an Event: setting an Event from a signal handler deadlocks when the
    # signal lands while this thread holds the Event's lock.
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    if os.getppid() != parent or stopping:
        return 1
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block",
         f"--port={port}", "--node-ip-address=127.0.0.1", "--include-dashboard=false",
         f"--num-cpus={num_cpus}", "--disable-usage-stats",
         # Ports of their own, not Ray's fixed defaults: jobs on one machine run side by side.
         "--min-worker-port=0", "--max-worker-port=0",
         f"--dashboard-agent-listen-port={_free_port()}",
         f"--ray-client-server-port={_free_port()}"],
        stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    threading.Thread(target=_relay, args=(head.stdout, ready), daemon=True).start()
    while not stopping and head.poll() is None:
        time.sleep(0.5)
    failed = None if stopping else head.poll()  # the head ended by itself
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=HEAD_STOP_S)
        except subprocess.TimeoutExpired:
            pass
    _reap_all()
    return 0 if failed is None else (failed or 1)


if __name__ == "__main__":
    sys.exit(_keep(*(int(arg) for arg in sys.argv[1:4]), sys.argv[4]))
