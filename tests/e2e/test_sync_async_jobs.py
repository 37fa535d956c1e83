"""End to end: asynchronous training with staleness modulation, and synchronous rounds."""

import json

import pytest

from tests.e2e.conftest import decaying_mnist_module, run_cli

pytestmark = pytest.mark.slow


def test_async_mnist_three_workers_with_staleness_modulation(mnist_records, tmp_path):
    out = tmp_path / "out"
    # About 250 versions: 63 minibatches per epoch, one version per push. Staleness
    # modulation divides the rate by 3-5 here (each worker's own previous push is one).
    module = decaying_mnist_module(tmp_path / "mnist_decaying.py", versions=260,
                                   initial_rate=0.003)
    result = run_cli(
        "train", "--model-def", module,
        "--training-data", mnist_records / "train", "--validation-data", mnist_records / "test",
        "--num-workers", 3, "--num-ps", 1, "--minibatch-size", 64, "--num-epochs", 4,
        "--lr-staleness-modulation", "--output", out, "--job-name", "async-e2e",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["evaluations"][-1]["metrics"]["accuracy"] >= 0.90
    counts = summary["staleness"]["ps-0"]["applied_by_staleness"]
    assert sum(counts) == summary["final_model_version"]
    assert sum(counts[1:]) > 0  # three workers do push stale gradients
    assert all(e["trained_never"] == 0 for e in summary["epochs"])


def test_sync_rounds_digits(digits_records, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-zoo", "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train",
        "--validation-data", digits_records / "test",
        "--num-workers", 2, "--num-ps", 2, "--minibatch-size", 32, "--num-epochs", 3,
        "--grads-to-wait", 2, "--output", out, "--job-name", "sync-e2e",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["evaluations"][-1]["metrics"]["accuracy"] >= 0.85
    minibatches = sum(-(-e["records"] // 32) for e in summary["epochs"])
    # Rounds of two pushes while both workers have work (asynchronous training would make
    # one version per push); how many pair up depends on when each worker starts.
    assert summary["final_model_version"] < minibatches
    assert all(e["trained_never"] == 0 for e in summary["epochs"])
