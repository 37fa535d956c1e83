import gzip
import os
import subprocess
import sys
import time

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


def decaying_mnist_module(path, versions, initial_rate=0.002):
    """Writes the zoo's MNIST CNN with Adam whose learning rate decays from `initial_rate`
    to almost nothing over `versions` model versions, and returns `path`. A job's final accuracy then
    does not hinge on where its last few steps landed: with a constant rate it swings by a
    point or more from epoch to epoch, more so in asynchronous training."""
    path.write_text(
        "import keras\n"
        "from model_zoo.mnist.mnist_functional import (\n"
        "    custom_model, dataset_fn, eval_metrics_fn, loss)\n\n\n"
        "def optimizer():\n"
        "    return keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(\n"
        f"        {initial_rate}, decay_steps={versions}, alpha=0.02))\n"
    )
    return path


def start_cli(*args, log_path, cwd=ROOT, env=None):
    """Starts `python -m elastic_keras ARGS` without waiting; its stderr and stdout go to
    `log_path` (a file, so a chatty job never blocks on a full pipe)."""
    with open(log_path, "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "elastic_keras", *map(str, args)],
            cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
        )


def job_processes(job_name):
    """{pid: command line} of the live processes whose command line names `job_name`
    (pass a name unique to the test). Zombies are left out: they no longer run."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                argv = f.read().decode("utf-8", "replace").split("\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:  # it ended while we looked
            continue
        if state != "Z" and job_name in argv:
            found[int(entry)] = " ".join(argv).strip()
    return found


def wait_for(condition, timeout_s, what, left=None):
    """Polls `condition()` until it returns something true; fails naming `what` (and what
    `left()` returns, when given: e.g. the processes still running)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            still = f"; still there: {left()}" if left else ""
            pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}{still}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def digits_records(tmp_path_factory):
    """scikit-learn's digits as TFRecord shards: 360 rows held out in test/ (2 files), the
    other 1,437 shuffled into train/ (2 files)."""
    out = tmp_path_factory.mktemp("digits") / "records"
    result = run_cli("data", "sklearn:digits", "--output", out, "--holdout-every", 5,
                     "--shuffle", "--num-shards", 2)
    assert result.returncode == 0, result.stderr
    return out


@pytest.fixture(scope="session")
def digits_csv(tmp_path_factory):
    """scikit-learn's digits as CSV files with a header (image_0 .. image_63, label):
    360 rows in test/, 1,437 in train/."""
    out = tmp_path_factory.mktemp("digits_csv") / "records"
    result = run_cli("data", "sklearn:digits", "--format", "csv", "--output", out,
                     "--holdout-every", 5, "--shuffle")
    assert result.returncode == 0, result.stderr
    return out


def read_examples(records_dir, num_pixels):
    """(images as float32 [n, num_pixels] of raw pixel values, int64 labels) of every
    `tf.train.Example` in the TFRecord files of `records_dir`."""
    import tensorflow as tf

    files = sorted(str(p) for p in records_dir.glob("*.tfrecord"))
    spec = {"image": tf.io.FixedLenFeature([num_pixels], tf.int64),
            "label": tf.io.FixedLenFeature([], tf.int64)}
    images, labels = [], []
    for batch in tf.data.TFRecordDataset(files).batch(1024):
        parsed = tf.io.parse_example(batch, spec)
        images.append(parsed["image"].numpy().astype(np.float32))
        labels.append(parsed["label"].numpy())
    return np.concatenate(images), np.concatenate(labels)
