"""End to end: evaluation every N model versions, and the TensorBoard event files of a job."""

import json

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.conftest import ROOT
from tests.e2e.conftest import run_cli

pytestmark = pytest.mark.slow


def test_evaluations_during_epochs_land_in_the_summary_and_tensorboard(digits_records,
                                                                       tmp_path):
    out = tmp_path / "out"
    result = run_cli(
        "train", "--model-zoo", ROOT / "model_zoo", "--model-def", "digits.digits_cnn",
        "--training-data", digits_records / "train", "--validation-data",
        digits_records / "test", "--num-workers", 2, "--minibatch-size", 16,
        "--num-minibatches-per-task", 4, "--num-epochs", 2, "--evaluation-steps", 20, "--output", out,
        "--job-name", "eval-steps-e2e",
    )
    assert result.returncode == 0, result.stderr[-5000:]
    summary = json.loads((out / "job_summary.json").read_text())
    evaluations = summary["evaluations"]
    # 1,437 records in minibatches of 16: 90 versions per epoch. A round is asked for every
    # 20 versions and starts once the running training tasks are done (the barrier that
    # pins its version): each epoch has rounds during it besides the one that ends it.
    during = [e for e in evaluations if not e["end_of_epoch"]]
    assert {e["epoch"] for e in during} == {1, 2}
    assert [e["epoch"] for e in evaluations if e["end_of_epoch"]] == [1, 2]
    versions = [e["model_version"] for e in evaluations]
    assert versions[0] >= 20
    assert all(b - a >= 1 for a, b in zip(versions, versions[1:]))
    assert all(b.get("end_of_epoch") or b["model_version"] - a["model_version"] >= 20
               for a, b in zip(evaluations, evaluations[1:]))
    assert all(0.0 <= e["metrics"]["accuracy"] <= 1.0 for e in evaluations)
    assert evaluations[-1]["metrics"]["accuracy"] >= 0.5  # learning (chance: 0.1)
    assert "Evaluation during epoch 1" in result.stderr

    events = EventAccumulator(str(out / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    tags = events.Tags()["tensors"]
    assert {"train/loss", "train/examples_per_second", "eval/accuracy"} <= set(tags)
    accuracy = [(e.step, float(tf.make_ndarray(e.tensor_proto)))
                for e in events.Tensors("eval/accuracy")]
    assert accuracy == [(e["model_version"], pytest.approx(e["metrics"]["accuracy"]))
                        for e in evaluations]
