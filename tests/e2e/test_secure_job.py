"""End to end: a job over `--tls auto` on 127.0.0.1 (the master's own CA, a certificate per
role, mutual TLS), scaled up with `elastic-keras scale` through the job's owner-only
credential; and a stranger with only the ports gets nothing from its roles."""

import json
import os
import re
import stat

import grpc
import numpy as np
import pytest

from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.ps_client import PSClient
from elastic_keras.master import job_locator
from tests.conftest import ROOT
from tests.e2e.conftest import run_cli, start_cli, wait_for

pytestmark = pytest.mark.slow


def test_a_tls_job_trains_scales_and_refuses_strangers(digits_records, tmp_path):
    job, out = f"tls-e2e-{os.getpid()}", tmp_path / "out"
    proc = start_cli(
        "train", "--model-zoo", ROOT / "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train", "--num-workers", 1, "--num-ps", 1,
        "--minibatch-size", 16, "--num-epochs", 20, "--tls", "auto", "--output", out,
        "--job-name", job, log_path=tmp_path / "job.log")
    try:
        worker_log = out / "logs" / "worker-0.log"
        wait_for(lambda: worker_log.exists() and "Worker 0 of job" in worker_log.read_text(),
                 120, "worker-0 to reach the parameter servers")
        entry = job_locator.find(job)
        path = job_locator._entry_path(job)
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
        assert entry["tls"]["target_name"] == f"{job}.elastic-keras"

        scaled = run_cli("scale", "--job-name", job, "--num-workers", 2, timeout=60)
        assert scaled.returncode == 0, scaled.stderr
        assert "workers 1 -> 2" in scaled.stderr

        # A stranger with the master's address and no certificate or credential.
        stranger = MasterClient(entry["address"], deadline_s=2.0)
        with pytest.raises(grpc.RpcError):
            stranger.get_task(0)
        stranger.close()
        ps_address = re.search(r"serving on (\S+) over TLS",
                               (out / "logs" / "ps-0.log").read_text()).group(1)
        shard = PSClient([ps_address], deadline_s=2.0)
        with pytest.raises(grpc.RpcError):
            shard.push_gradients(0, 10**15, [0], {"x": np.ones(1, np.float32)})
        shard.close()

        # Scaled up while it trains: worker-1 starts before the job can end.
        wait_for(lambda: "Scaled up: started worker-1" in (tmp_path / "job.log").read_text(),
                 120, "worker-1 to start")
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    log = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, log[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    assert summary["status"] == "succeeded" and summary["num_workers"] == 2
    assert all(e["trained_never"] == 0 for e in summary["epochs"])
    assert "Scaled up: started worker-1" in log
    assert "over TLS" in (out / "logs" / "ps-0.log").read_text()

