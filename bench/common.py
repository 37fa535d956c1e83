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
