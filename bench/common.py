"""Shared pieces of the benchmarks: result lines, data preparation, child processes."""

import gzip
import json
import os
import pathlib
import resource
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


def emit(name, config, value, unit, peak_rss_mb, peer=None, peer_value=None):
    """Prints one result as a JSON line."""
    ratio = round(value / peer_value, 3) if peer_value else None
    print(json.dumps({
        "name": name, "config": config, "value": round(value, 1), "unit": unit,
        "peak_rss_mb": round(peak_rss_mb, 1), "peer": peer,
        "peer_value": None if peer_value is None else round(peer_value, 1), "ratio": ratio,
    }), flush=True)


def peak_rss_mb():
    """The largest resident set of this process and any child it waited for, in MB."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024.0


def run_child(module, *args):
    """Runs `python -m module args` and returns the JSON object it prints last."""
    result = subprocess.run(
        [sys.executable, "-m", module, *map(str, args)], cwd=ROOT, capture_output=True,
        text=True, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR"},
    )
    if result.returncode != 0:
        raise RuntimeError(f"{module} {args} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def mnist_records(work_dir):
    """MNIST 5k as TFRecord: 4,000 shuffled training rows in `work_dir/train`."""
    import numpy as np

    out = pathlib.Path(work_dir)
    if (out / "records" / "train").is_dir():
        return out / "records"
    source = SHARED_DATA / "mnist_5k.csv.gz"
    if not source.exists():
        raise SystemExit(f"the MNIST benchmark needs {source}")
    with gzip.open(source, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / "mnist.npz", image=table[:, :784], label=table[:, 784])
    subprocess.run(
        [sys.executable, "-m", "elastic_keras", "data", str(out / "mnist.npz"), "--output",
         str(out / "records"), "--holdout-every", "5", "--shuffle", "--num-shards", "2"],
        cwd=ROOT, check=True, capture_output=True,
    )
    return out / "records"


class ChildServer:
    """A `python -m MODULE serve ARGS...` child process: it prints the ports it serves on
    (one line, space-separated), then serves until its stdin closes (`close`). A child may
    also take requests, one line each, and answer each with a line of ports (`ask`)."""

    def __init__(self, module, *args):
        self._process = subprocess.Popen(
            [sys.executable, "-m", module, "serve", *map(str, args)], cwd=ROOT, text=True,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "GRPC_VERBOSITY": "ERROR"},
        )
        self._what = f"{module} serve {' '.join(map(str, args))}"
        self._read_ports()

    def _read_ports(self):
        line = self._process.stdout.readline()
        if not line.split() or not all(port.isdigit() for port in line.split()):
            self.close()
            raise RuntimeError(f"{self._what} did not answer with ports: {line!r}")
        self.addresses = [f"127.0.0.1:{int(port)}" for port in line.split()]
        self.address = self.addresses[0]

    def ask(self, request):
        """Sends the child one line; returns the addresses it then serves on."""
        self._process.stdin.write(request + "\n")
        self._process.stdin.flush()
        self._read_ports()
        return self.addresses

    def peak_rss_mb(self):
        """The child's largest resident set so far (VmHWM), in MB."""
        with open(f"/proc/{self._process.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
        return 0.0

    def close(self):
        self._process.stdin.close()
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def serve_until_stdin_closes(servers_and_ports):
    """Prints the ports for the parent (`ChildServer`), then serves until stdin closes.

    Args:
        servers_and_ports: `(server, port)` pairs, as `rpc.create_server` returns them.
    """
    print(" ".join(str(port) for _, port in servers_and_ports), flush=True)
    sys.stdin.read()
    for server, _ in servers_and_ports:
        server.stop(0)
