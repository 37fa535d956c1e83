import gzip
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import ROOT


def run_cli(*args, timeout=600, cwd=ROOT, env=None):
    """Runs `python -m elastic_keras ARGS` as a real subprocess."""
    return subprocess.run(
        [sys.executable, "-m", "elastic_keras", *map(str, args)],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="session")
def mnist_records(shared_data, tmp_path_factory):
    """MNIST 5k as TFRecord shards via `elastic-keras data`: rows whose index is divisible
    by 5 held out (1,000 in test/), the other 4,000 shuffled into train/."""
    with gzip.open(shared_data / "mnist_5k.csv.gz", "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    out = tmp_path_factory.mktemp("mnist")
    np.savez(out / "mnist.npz", image=table[:, :784], label=table[:, 784])
    result = run_cli("data", out / "mnist.npz", "--output", out / "records",
                     "--holdout-every", "5", "--shuffle", "--num-shards", "4")
    assert result.returncode == 0, result.stderr
    return out / "records"
