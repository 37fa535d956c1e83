"""`elastic-keras evaluate`, `predict` and `export` end to end, on checkpoints of a real MNIST
training job (2 workers, 2 PS): real master, parameter servers restored from the checkpoints
and workers, as local processes.

- evaluate on 1 PS (the checkpoint re-sharded) gives the training job's final evaluation;
- predict without a processor, with a worker SIGKILLed mid-run: every record of every file
  predicted exactly once, each equal to the model's output computed here from the checkpoint;
- predict with the module's processor over an ensemble of the three newest checkpoints: the
  processor (in the master) gets every record once, the mean of the members' outputs;
- export without data writes the SavedModel the training job wrote.
"""

import csv
import json
import os
import signal
import time

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.checkpoint_layout import list_checkpoints
from elastic_keras.common.model_spec import Mode, load_model_spec
from elastic_keras.common.model_variables import named_variables
from elastic_keras.data.reader import open_reader
from elastic_keras.ps.checkpoint import load_shards
from tests.conftest import ROOT
from tests.e2e.conftest import job_processes, run_cli, start_cli

pytestmark = pytest.mark.slow

MODEL = ("--model-zoo", ROOT / "model_zoo", "--model-def", "mnist.mnist_functional")
PLAIN = """
import time
import tensorflow as tf
from model_zoo.mnist.mnist_functional import custom_model, eval_metrics_fn, loss, optimizer
from model_zoo.mnist.mnist_functional import dataset_fn as _parse


def dataset_fn(dataset, mode, metadata):
    parsed = _parse(dataset, mode, metadata)
    if mode != "prediction":
        return parsed
    def slowly(image):  # about 10 ms a record: a worker is still at work when it is killed
        tf.py_function(lambda: time.sleep(0.01), [], [])
        return image
    return parsed.map(slowly)
"""
PROCESSOR = """
import json, os
import numpy as np
from model_zoo.mnist.mnist_functional import (
    custom_model, dataset_fn, eval_metrics_fn, loss, optimizer)


class PredictionOutputsProcessor:
    def __init__(self):
        self.path = os.environ["PROCESSED"]

    def process(self, predictions, worker_id):
        with open(self.path, "a") as f:
            f.write(json.dumps({"worker": worker_id,
                                "rows": np.asarray(predictions).tolist()}) + "\\n")
"""


@pytest.fixture(scope="module")
def trained(mnist_records, tmp_path_factory):
    """A finished 1-epoch job with checkpoints every 15 versions (all kept) and its export."""
    out = tmp_path_factory.mktemp("trained")
    result = run_cli(
        "train", *MODEL, "--training-data", mnist_records / "train",
        "--validation-data", mnist_records / "test", "--num-workers", "2", "--num-ps", "2",
        "--minibatch-size", "64", "--checkpoint-dir", out / "ckpt", "--checkpoint-steps", "15",
        "--keep-checkpoint-max", "0", "--output", out / "train", "--job-name", "ckpt-cmd-train")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((out / "train" / "job_summary.json").read_text())
    checkpoints = [path for _, path in list_checkpoints(str(out / "ckpt"))]
    assert len(checkpoints) >= 3
    return {"out": out, "summary": summary, "checkpoints": checkpoints,
            "records": mnist_records}


def _features(records_dir):
    """{(file, record index): image} of every record of the test files."""
    spec = load_model_spec(str(ROOT / "model_zoo"), "mnist.mnist_functional")
    images = {}
    for path in sorted(str(p) for p in (records_dir / "test").glob("*.tfrecord")):
        reader = open_reader(path)
        records = list(reader.read(0, reader.num_records))
        dataset = spec.dataset_fn(tf.data.Dataset.from_tensor_slices(records),
                                  Mode.PREDICTION, reader.metadata)
        for i, image in enumerate(dataset):
            images[(path, i)] = image.numpy()
    return images


def _model_of(checkpoint):
    """The MNIST model with a checkpoint's values, read from its shard files here."""
    spec = load_model_spec(str(ROOT / "model_zoo"), "mnist.mnist_functional")
    keras.utils.clear_session()
    model = spec.custom_model()
    model(np.zeros((1, 28, 28, 1), np.float32))
    dense = load_shards(checkpoint, 0, 1).dense
    for name, variable in named_variables(model).items():
        variable.assign(dense[name])
    return model


def _outputs(model, images, keys):
    return model.predict(np.stack([images[k] for k in keys]), verbose=0, batch_size=256)


def test_evaluate_on_fewer_shards_gives_the_training_jobs_final_evaluation(trained, tmp_path):
    result = run_cli(
        "evaluate", *MODEL, "--validation-data", trained["records"] / "test",
        "--checkpoint-dir-for-init", trained["out"] / "ckpt", "--num-workers", "2",
        "--num-ps", "1", "--minibatch-size", "64", "--output", tmp_path,
        "--job-name", "ckpt-cmd-evaluate")
    assert result.returncode == 0, result.stderr[-3000:]
    final = trained["summary"]["evaluations"][-1]
    written = json.loads((tmp_path / "evaluation.json").read_text())
    assert written["checkpoints"] == [trained["checkpoints"][-1]]
    assert written["model_version"] == final["model_version"]
    assert set(written["metrics"]) == set(final["metrics"]) == {"accuracy"}
    assert written["metrics"]["accuracy"] == pytest.approx(final["metrics"]["accuracy"],
                                                           abs=1e-6)
    summary = json.loads((tmp_path / "job_summary.json").read_text())
    assert (summary["status"], summary["job_type"]) == ("succeeded", "evaluate")
    assert summary["outputs"]["records"] == 1000 and summary["epochs"] == []
    assert "metrics: {\"accuracy\"" in result.stderr


def test_predict_writes_every_record_once_though_a_worker_is_killed(trained, tmp_path):
    module = tmp_path / "mnist_plain.py"
    module.write_text(PLAIN)
    out = tmp_path / "out"
    job = start_cli(
        "predict", "--model-zoo", ROOT, "--model-def", module,
        "--prediction-data", trained["records"] / "test",
        "--checkpoint-dir-for-init", trained["out"] / "ckpt", "--num-workers", "2",
        "--minibatch-size", "16", "--output", out, "--job-name", "ckpt-cmd-predict",
        log_path=tmp_path / "job.log", env={"PYTHONPATH": str(ROOT)})
    try:
        victim = _worker_pid("ckpt-cmd-predict", "0", job)
        while job.poll() is None and not list((out / "predictions").glob("*.jsonl")):
            time.sleep(0.1)
        assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        os.kill(victim, signal.SIGKILL)
        assert job.wait(timeout=300) == 0, (tmp_path / "job.log").read_text()[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
    summary = json.loads((out / "job_summary.json").read_text())
    assert any(e["role"] == "worker-0" and e["reason"] == "killed"
               for e in summary["role_exits"]), summary["role_exits"]
    assert summary["tasks_requeued"] >= 1  # it was killed holding a task
    lines = [json.loads(line) for part in sorted((out / "predictions").glob("*.jsonl"))
             for line in part.read_text().splitlines()]
    keys = [(line["file"], line["record"]) for line in lines]
    images = _features(trained["records"])
    assert sorted(keys) == sorted(images) and len(keys) == len(set(keys)) == 1000
    expected = _outputs(_model_of(trained["checkpoints"][-1]), images, keys)
    np.testing.assert_allclose([line["prediction"] for line in lines], expected, atol=1e-4)


def _worker_pid(job_name, worker_id, job, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and job.poll() is None:
        for pid, command in job_processes(job_name).items():
            if "elastic_keras.worker" in command and f"--worker-id {worker_id} " in command:
                return pid
        time.sleep(0.2)
    raise AssertionError(f"worker {worker_id} of {job_name} never started")


def test_an_ensembles_processor_gets_every_record_once_as_the_members_mean(trained, tmp_path):
    module = tmp_path / "mnist_processed.py"
    module.write_text(PROCESSOR)
    processed = tmp_path / "processed.jsonl"
    result = run_cli(
        "predict", "--model-zoo", ROOT, "--model-def", module,
        "--prediction-data", trained["records"] / "test",
        "--checkpoint-dir-for-init", trained["out"] / "ckpt", "--ensemble", "last-3",
        "--num-workers", "2", "--minibatch-size", "64", "--output", tmp_path / "out",
        "--job-name", "ckpt-cmd-ensemble",
        env={"PYTHONPATH": str(ROOT), "PROCESSED": str(processed)})
    assert result.returncode == 0, result.stderr[-3000:]
    calls = [json.loads(line) for line in processed.read_text().splitlines()]
    assert {c["worker"] for c in calls} <= {0, 1}
    assert all(1 <= len(c["rows"]) <= 64 for c in calls)
    rows = np.array([row for c in calls for row in c["rows"]])
    assert rows.shape == (1000, 10)
    # Tasks come in any order, records within one in order: compare as sorted sets of rows.
    images = _features(trained["records"])
    keys = sorted(images)
    members = trained["checkpoints"][-3:]
    expected = np.mean([_outputs(_model_of(m), images, keys) for m in members], axis=0)
    _assert_same_rows(rows, expected)
    summary = json.loads((tmp_path / "out" / "job_summary.json").read_text())
    assert summary["outputs"]["checkpoints"] == members[::-1]
    assert summary["outputs"]["predictions"] == "PredictionOutputsProcessor.process"


def _assert_same_rows(actual, expected, atol=1e-4):
    """Every row of `actual` is one row of `expected`, each matched once."""
    distance = np.abs(actual[:, None, :] - expected[None, :, :]).max(axis=-1)
    nearest = distance.argmin(axis=1)
    assert distance[np.arange(len(actual)), nearest].max() <= atol
    assert len(set(nearest.tolist())) == len(expected)


def test_export_without_training_writes_the_model_training_wrote(trained, tmp_path):
    result = run_cli("export", *MODEL, "--checkpoint-dir-for-init", trained["out"] / "ckpt",
                     "--output", tmp_path, "--job-name", "ckpt-cmd-export")
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "job_summary.json").read_text())
    assert summary["saved_model"] == str(tmp_path / "saved_model")
    assert not any(e["role"].startswith("worker") for e in summary["role_exits"])
    exported = tf.saved_model.load(str(tmp_path / "saved_model"))
    trained_model = tf.saved_model.load(str(trained["out"] / "train" / "saved_model"))
    images = np.stack(list(_features(trained["records"]).values())[:32])
    np.testing.assert_allclose(exported.serve(images), trained_model.serve(images), atol=1e-6)


def test_census_with_tables_evaluates_predicts_and_exports_from_its_checkpoint(shared_data,
                                                                               tmp_path):
    """Census wide & deep, whose embedding tables live on the shards: trained on 2 PS,
    evaluated and predicted on 1 (the tables re-sharded), exported without data."""
    data = tmp_path / "adult"
    assert run_cli("data", shared_data / "adult.csv.gz", "--format", "csv", "--holdout-every",
                   5, "--shuffle", "--output", data).returncode == 0
    census = ("--model-zoo", ROOT / "model_zoo", "--model-def", "census.wide_deep")
    common = ("--num-workers", 2, "--minibatch-size", 256)
    trained = run_cli("train", *census, *common, "--num-ps", 2, "--training-data",
                      data / "train", "--validation-data", data / "test", "--checkpoint-dir",
                      tmp_path / "ckpt", "--output", tmp_path / "train",
                      "--job-name", "ckpt-cmd-census-train")
    assert trained.returncode == 0, trained.stderr[-3000:]
    final = json.loads((tmp_path / "train" / "job_summary.json").read_text())["evaluations"][-1]

    evaluated = run_cli("evaluate", *census, *common, "--validation-data", data / "test",
                        "--checkpoint-dir-for-init", tmp_path / "ckpt",
                        "--output", tmp_path / "evaluate", "--job-name", "ckpt-cmd-census-eval")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    metrics = json.loads((tmp_path / "evaluate" / "evaluation.json").read_text())["metrics"]
    assert metrics.keys() == final["metrics"].keys()
    for name, value in final["metrics"].items():
        assert metrics[name] == pytest.approx(value, abs=1e-6), name

    predicted = run_cli("predict", *census, *common, "--prediction-data", data / "test",
                        "--checkpoint-dir-for-init", tmp_path / "ckpt",
                        "--output", tmp_path / "predict", "--job-name", "ckpt-cmd-census-pred")
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    lines = [json.loads(line) for part in (tmp_path / "predict" / "predictions").iterdir()
             for line in part.read_text().splitlines()]
    test_file = str(next((data / "test").glob("*.csv")))
    assert sorted(line["record"] for line in lines) == list(range(9769))
    assert {line["file"] for line in lines} == {test_file}

    exported = run_cli("export", *census, "--checkpoint-dir-for-init", tmp_path / "ckpt",
                       "--output", tmp_path / "export", "--job-name", "ckpt-cmd-census-export")
    assert exported.returncode == 0, exported.stderr[-3000:]
    served, reference = (tf.saved_model.load(str(tmp_path / d / "saved_model"))
                         for d in ("export", "train"))
    features = _census_features(test_file, 200)
    np.testing.assert_allclose(served.serve(features), reference.serve(features), atol=1e-6)
    by_record = {line["record"]: line["prediction"] for line in lines}
    np.testing.assert_allclose([by_record[i] for i in range(200)],
                               reference.serve(features).numpy(), atol=1e-5)


def _census_features(path, rows):
    """The first `rows` records of a census CSV shard, as the exported model takes them."""
    numeric = {"age", "fnlwgt", "educational-num", "capital-gain", "capital-loss",
               "hours-per-week"}
    with open(path, newline="") as f:
        table = list(csv.DictReader(f))[:rows]
    return {name.replace("-", "_"): tf.constant(
        [float(r[name]) for r in table] if name in numeric else [r[name].strip() for r in table])
        for name in table[0] if name != "income"}
