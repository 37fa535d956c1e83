"""What an engine costs a job: start-up, and replacing a lost worker.

`python -m bench engines` runs the same small job (the MNIST CNN, 2 workers, 1 PS) on the
local engine, on the Kubernetes engine against the test suite's fake cluster (kmock, a fake
API server in its own process, driven over HTTP by the official client, and a fake kubelet
that runs each pod's command as a local process: so the figures count the engine's API
calls, its watch and Secrets, not a real cluster's scheduling or image pulls), and on the Ray
engine with the Ray cluster it starts on 127.0.0.1. Per engine, measured from this process,
side by side in one run:

- `engines/<engine>/startup_s`: from starting `elastic-keras train` to the last worker's
  model being built (the job about to train);
- `engines/<engine>/replace_worker_s`: from losing worker-0 (SIGKILL of its process locally
  and on Ray, deleting its pod on Kubernetes) to its replacement's model being built.
"""

import os
import pathlib
import signal
import subprocess
import sys
import tempfile
import time
import uuid

from bench.common import CHILD_ENV, ROOT, emit

TIMEOUT_S = 300.0
NAMESPACE = "bench"


def _when(path_of, text, timeout_s=TIMEOUT_S):
    """The time at which a file (`path_of()` -> path) first holds `text`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        path = pathlib.Path(path_of())
        if path.exists() and text in path.read_text(errors="replace"):
            return time.monotonic()
        time.sleep(0.05)
    raise TimeoutError(f"{text!r} never appeared in {path_of()}")


def _job(records, work, job, engine_flags):
    return subprocess.Popen(
        [sys.executable, "-m", "elastic_keras", "train", "--job-name", job,
         "--model-zoo", str(ROOT / "model_zoo"), "--model-def", "mnist.mnist_functional",
         "--training-data", str(records / "train"), "--output", str(work / "out"),
         "--num-workers", "2", "--num-ps", "1", "--minibatch-size", "16",
         "--num-epochs", "2", *engine_flags],
        cwd=ROOT, env={**os.environ, **CHILD_ENV}, stdout=open(work / "job.log", "w"),
        stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def _measure(engine, records, work, start, worker_log, lose_worker):
    job = f"bench-{engine[:4]}-{uuid.uuid4().hex[:6]}"
    began = time.monotonic()
    proc = start(job)
    try:
        ready = max(_when(lambda w=w: worker_log(job, w, 0), "Model built") for w in (0, 1))
        lost = time.monotonic()
        lose_worker(job)
        replaced = _when(lambda: worker_log(job, 0, 1), "Model built")
        proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            proc.wait(timeout=60)
    params = {"workers": 2, "ps": 1, "model": "mnist_functional"}
    emit(f"engines/{engine}/startup_s", params, ready - began, "s", None)
    emit(f"engines/{engine}/replace_worker_s", params, replaced - lost, "s", None)


def _local(records, work, engine="local", flags=()):
    from bench.recovery import _pid

    logs = work / engine / "out" / "logs"
    (work / engine).mkdir()

    def log(job, worker, launch):
        # Every launch of a role appends to one log: a launch's own "Model built" is the
        # (launch + 1)-th.
        return logs / f"worker-{worker}.log" if _count(logs / f"worker-{worker}.log",
                                                      "Model built") > launch else "/absent"

    _measure(engine, records, work, lambda job: _job(records, work / engine, job, list(flags)),
             log, lambda job: os.kill(_pid(job, "worker", 0), signal.SIGKILL))


def _count(path, text):
    try:
        return pathlib.Path(path).read_text(errors="replace").count(text)
    except OSError:
        return 0


def _kubernetes(records, work):
    sys.path.insert(0, str(ROOT))
    from tests.engines.fake_cluster import FakeKubelet, KubeApi

    (work / "k8s").mkdir()
    with KubeApi(work / "k8s" / "api") as api:
        kubelet = FakeKubelet(api.kubeconfig, NAMESPACE, work / "k8s" / "pods").start()
        core = api.core_v1()
        try:
            flags = ["--engine", "kubernetes", "--image", "bench:1", "--namespace", NAMESPACE,
                     "--kubeconfig", str(api.kubeconfig)]
            _measure("kubernetes", records, work,
                     lambda job: _job(records, work / "k8s", job, flags),
                     lambda job, w, launch: kubelet.log_path(
                         f"{job}-worker-{w}" + (f"-r{launch}" if launch else "")),
                     lambda job: core.delete_namespaced_pod(f"{job}-worker-0", NAMESPACE))
        finally:
            kubelet.stop()


def run(quick=False):
    from bench.common import mnist_records

    with tempfile.TemporaryDirectory(prefix="bench-engines-") as tmp:
        work = pathlib.Path(tmp)
        records = mnist_records(work / "mnist")
        _local(records, work)
        _kubernetes(records, work)
        _local(records, work, "ray", ("--engine", "ray"))


if __name__ == "__main__":
    run()
