"""End to end: a job whose gradients and parameters travel lz4-compressed, in bfloat16, in
64 KiB chunks (the digits CNN is 77 KB in bfloat16: every push and pull is streamed)."""

import json

import pytest

from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow


def test_lz4_bfloat16_small_chunks_train_digits(digits_records, tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-zoo", "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train", "--validation-data", digits_records / "test",
        "--num-workers", 2, "--num-ps", 1, "--minibatch-size", 8, "--num-epochs", 2,
        "--compression", "lz4", "--transfer-dtype", "bfloat16", "--chunk-bytes", 65536,
        "--output", out, "--job-name", "transfers-e2e",
    )
    assert result.returncode == 0, result.stderr[-5000:]

    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded"
    assert [e["trained_never"] for e in summary["epochs"]] == [0, 0]
    assert summary["tasks_failed"] == 0
    assert len(summary["evaluations"]) == 2
    assert summary["evaluations"][-1]["metrics"]["accuracy"] > 0.85
    # The flags reached both roles.
    sent = "sends compression lz4, 65536-byte chunks, transfer dtype bfloat16"
    for role in ("ps-0", "worker-0", "worker-1"):
        log = (out / "logs" / f"{role}.log").read_text()
        assert sent in log, log[-3000:]
