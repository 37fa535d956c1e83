"""A small job on a real Kubernetes cluster: opt-in, skipped unless configured.

Set ELASTIC_KERAS_TEST_KUBECONFIG (a kubeconfig whose user may create pods in the namespace),
ELASTIC_KERAS_TEST_IMAGE (built from deploy/Dockerfile and pushed where the cluster pulls),
ELASTIC_KERAS_TEST_NAMESPACE (with deploy/rbac.yaml applied), ELASTIC_KERAS_TEST_DATA (a
directory of TFRecord files, e.g. made by `elastic-keras data sklearn:digits`, at the same path
in the pods) and ELASTIC_KERAS_TEST_VOLUME (the --volume that mounts it there), then run
`python -m pytest tests/engines/test_real_cluster.py`.
"""

import os
import uuid

import pytest

from tests.e2e.conftest import run_cli

NEEDED = ("KUBECONFIG", "IMAGE", "NAMESPACE", "DATA", "VOLUME")
SETTINGS = {name: os.environ.get(f"ELASTIC_KERAS_TEST_{name}", "") for name in NEEDED}

pytestmark = pytest.mark.skipif(
    not all(SETTINGS.values()),
    reason="no real cluster configured (ELASTIC_KERAS_TEST_{%s})" % ",".join(NEEDED))


def test_a_small_job_succeeds_on_a_real_cluster():
    job = f"ek-test-{uuid.uuid4().hex[:8]}"
    result = run_cli(
        "train", "--engine", "kubernetes", "--kubeconfig", SETTINGS["KUBECONFIG"],
        "--image", SETTINGS["IMAGE"], "--namespace", SETTINGS["NAMESPACE"],
        "--service-account", "elastic-keras-master", "--volume", SETTINGS["VOLUME"],
        "--host", "0.0.0.0", "--tls", "auto", "--job-name", job,
        "--model-def", "digits.digits_cnn", "--training-data",
        os.path.join(SETTINGS["DATA"], "train"), "--num-workers", 2, "--num-ps", 1,
        "--output", os.path.join(SETTINGS["DATA"], job), timeout=1800)
    assert result.returncode == 0, result.stderr[-5000:]
    assert f"Job {job} succeeded" in result.stderr
