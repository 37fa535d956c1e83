"""What an evaluate job leaves (master/outputs.py): its metrics written to evaluation.json, and
a failed job, never an empty file, when its round yields no metrics."""

import json
import types

import keras
import numpy as np

from elastic_keras.common.config import JobConfig
from elastic_keras.common.metrics import build_metrics, to_states
from elastic_keras.master.evaluation import Evaluations
from elastic_keras.master.outputs import JobOutputs
from elastic_keras.master.tasks import EvalRound


def _evaluate(metrics_fn, output):
    config = JobConfig(model_def="m.m", job_type="evaluate", validation_data="unused",
                       checkpoint_dir_for_init="ckpt", output=str(output))
    spec = types.SimpleNamespace(module_name="m.m", eval_metrics_fn=metrics_fn,
                                 prediction_outputs_processor=None)
    outputs = JobOutputs(config, spec)
    outputs.members = ["ckpt/version-0000000040"]
    return outputs, Evaluations(metrics_fn, every_steps=0)


def test_the_rounds_metrics_are_written_to_evaluation_json(tmp_path):
    metrics_fn = lambda: {"accuracy": keras.metrics.SparseCategoricalAccuracy()}  # noqa: E731
    outputs, evaluations = _evaluate(metrics_fn, tmp_path)
    metrics = build_metrics(metrics_fn)
    metrics["accuracy"].update_state(np.array([1, 2]), np.eye(3, dtype=np.float32)[[1, 0]])
    evaluations.add(to_states(metrics), 40)
    outputs.round_closed(EvalRound(0, 40, True), evaluations)
    assert outputs.error == ""
    assert outputs.finish(None, evaluations, "") == ""
    written = json.loads((tmp_path / "evaluation.json").read_text())
    assert written == {"checkpoints": ["ckpt/version-0000000040"], "model_version": 40,
                       "ensemble_combiner": "", "metrics": {"accuracy": 0.5}}


def test_a_round_without_metrics_fails_the_job(tmp_path):
    outputs, evaluations = _evaluate(lambda: {}, tmp_path)
    evaluations.add([], 40)
    outputs.round_closed(EvalRound(0, 40, True), evaluations)
    assert "the evaluation produced no metrics" in outputs.error
    assert outputs.finish(None, evaluations, "") == outputs.error
    assert not (tmp_path / "evaluation.json").exists()
