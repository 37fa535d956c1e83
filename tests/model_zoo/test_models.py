"""The example model zoo trains for real: records -> dataset_fn -> GradientTape steps.

Each module is loaded with `load_model_spec`, fed serialized `tf.train.Example` records built
in memory (MNIST from the shared data folder, scikit-learn's digits), and trained with a
plain `tf.GradientTape` loop, as a worker would, with the module's own model, loss and
optimizer.
"""

import gzip
import logging
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.model_spec import Mode, load_model_spec
from elastic_keras.data.reader import Metadata

REPO = Path(__file__).resolve().parents[2]
ZOO = REPO / "model_zoo"
BATCH_SIZE = 32


def serialize(image, label=None):
    """One `tf.train.Example` with int64 features `image` (flat) and, if given, `label`."""
    feature = {"image": tf.train.Feature(int64_list=tf.train.Int64List(value=image.ravel()))}
    if label is not None:
        feature["label"] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(label)]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def metadata(records):
    return Metadata(path="<memory>", format="tfrecord", num_records=len(records), column_names=())


def shuffled(images, labels, seed=0):
    order = np.random.default_rng(seed).permutation(len(labels))
    return images[order], labels[order]


@pytest.fixture(scope="module")
def mnist(shared_data):
    """600 MNIST images (every 8th row of the label-sorted file), shuffled: (images, labels).

    `shared_data` (tests/conftest.py) skips the tests, saying why, when ../shared/data is absent.
    """
    with gzip.open(shared_data / "mnist_5k.csv.gz", "rt") as f:
        rows = np.loadtxt(f, delimiter=",", dtype=np.int64)[::8][:600]
    return shuffled(rows[:, :784], rows[:, 784])


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's 1,797 8x8 digits, shuffled: (images with values 0-16, labels)."""
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    return shuffled(data.data.astype(np.int64), data.target.astype(np.int64))


@pytest.fixture(autouse=True)
def fresh_keras():
    """Seeds Keras, and afterwards clears its session and the zoo `load_model_spec` put on
    `sys.path`."""
    saved_path = list(sys.path)
    keras.utils.set_random_seed(0)
    yield
    keras.utils.clear_session()
    sys.path[:] = saved_path


def batches(spec, images, labels, mode=Mode.TRAINING):
    records = [serialize(image, label) for image, label in zip(images, labels)]
    dataset = tf.data.Dataset.from_tensor_slices(records)
    return spec.dataset_fn(dataset, mode, metadata(records)).batch(BATCH_SIZE)


def make_train_step(spec, model, optimizer):
    @tf.function
    def train_step(features, labels):
        with tf.GradientTape() as tape:
            loss = spec.loss(labels, model(features, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step


def train(spec, dataset, epochs=1):
    """Trains the module's model on `dataset`; returns (model, loss of each step)."""
    model, optimizer = spec.custom_model(), spec.optimizer()
    features, _ = next(iter(dataset))
    model(features)  # Builds a subclassed model's variables before tracing the step.
    optimizer.build(model.trainable_variables)
    train_step = make_train_step(spec, model, optimizer)
    losses = [
        float(train_step(features, labels)) for _ in range(epochs) for features, labels in dataset
    ]
    return model, losses


def accuracy(spec, model, dataset):
    metric = spec.eval_metrics_fn()["accuracy"]
    for features, labels in dataset:
        metric.update_state(labels, model(features, training=False))
    return float(metric.result())


MNIST_MODULES = ["mnist.mnist_functional", "mnist.mnist_subclass"]


@pytest.mark.parametrize("model_def", MNIST_MODULES)
def test_mnist_loss_drops_within_one_epoch(mnist, model_def):
    spec = load_model_spec(str(ZOO), model_def)
    spec.check()
    dataset = batches(spec, *mnist)
    features, labels = next(iter(dataset))
    assert features.shape == (BATCH_SIZE, 28, 28, 1) and features.dtype == tf.float32
    assert 0.0 <= float(tf.reduce_min(features)) and float(tf.reduce_max(features)) <= 1.0
    assert labels.shape == (BATCH_SIZE,) and labels.dtype == tf.int64

    _, losses = train(spec, dataset)
    assert len(losses) == 19
    first, last = np.mean(losses[:3]), np.mean(losses[-3:])
    assert last < 0.6 * first, f"loss did not drop: {losses}"


def test_digits_loss_drops_and_reaches_95_percent_test_accuracy(digits):
    spec = load_model_spec(str(ZOO), "digits.digits_cnn")
    spec.check()
    images, labels = digits
    train_set = batches(spec, images[:1437], labels[:1437])
    test_set = batches(spec, images[1437:], labels[1437:], mode=Mode.EVALUATION)

    model, losses = train(spec, train_set, epochs=8)
    steps_per_epoch = len(losses) // 8
    first, last = np.mean(losses[:3]), np.mean(losses[steps_per_epoch - 3 : steps_per_epoch])
    assert last < 0.6 * first, f"loss did not drop in the first epoch: {losses}"
    assert accuracy(spec, model, test_set) >= 0.95


@pytest.mark.parametrize(
    "model_def, image_shape, max_pixel",
    [
        ("mnist.mnist_functional", (28, 28, 1), 255),
        ("mnist.mnist_subclass", (28, 28, 1), 255),
        ("digits.digits_cnn", (8, 8, 1), 16),
    ],
)
@pytest.mark.parametrize("mode", [Mode.PREDICTION, "prediction"])
def test_prediction_mode_yields_features_only(model_def, image_shape, max_pixel, mode):
    spec = load_model_spec(str(ZOO), model_def)
    images = np.random.default_rng(1).integers(0, max_pixel + 1, (5, int(np.prod(image_shape))))
    records = [serialize(image) for image in images]  # Records to predict carry no label.
    dataset = spec.dataset_fn(tf.data.Dataset.from_tensor_slices(records), mode, metadata(records))
    assert isinstance(dataset.element_spec, tf.TensorSpec)
    assert dataset.element_spec.shape == image_shape
    (features,) = list(dataset.batch(5))
    np.testing.assert_allclose(
        features.numpy().reshape(5, -1), images / max_pixel, rtol=1e-6
    )
    predictions = spec.custom_model()(features)
    assert predictions.shape == (5, 10)


@pytest.mark.parametrize("model_def", MNIST_MODULES + ["digits.digits_cnn"])
def test_evaluation_mode_yields_features_and_labels(model_def):
    spec = load_model_spec(str(ZOO), model_def)
    size = 784 if model_def.startswith("mnist") else 64
    records = [serialize(np.zeros(size, np.int64), label) for label in (3, 7)]
    dataset = spec.dataset_fn(
        tf.data.Dataset.from_tensor_slices(records), "evaluation", metadata(records)
    )
    assert [int(label) for _, label in dataset] == [3, 7]


@pytest.mark.parametrize("model_def", MNIST_MODULES + ["digits.digits_cnn"])
def test_prediction_outputs_processor_reports_the_argmax(model_def, caplog):
    spec = load_model_spec(str(ZOO), model_def)
    processor = spec.prediction_outputs_processor()
    predictions = np.eye(10, dtype=np.float32)[[4, 2]]
    with caplog.at_level(logging.INFO):
        digits = processor.process(predictions, worker_id=3)
    assert list(digits) == [4, 2]
    assert "Worker 3 predicted digits: [4, 2]" in caplog.text


def test_the_metric_takes_logits():
    spec = load_model_spec(str(ZOO), "mnist.mnist_functional")
    metric = spec.eval_metrics_fn()["accuracy"]
    metric.update_state(tf.constant([1, 2]), tf.constant([[0.0, 5.0, -1.0], [0.0, 5.0, -1.0]]))
    assert float(metric.result()) == 0.5


def _parsed(model_def, mode, images, labels):
    spec = load_model_spec(str(ZOO), model_def)
    records = [serialize(image, label) for image, label in zip(images, labels)]
    dataset = spec.dataset_fn(tf.data.Dataset.from_tensor_slices(records), mode,
                              metadata(records))
    return list(dataset.batch(len(records)))[0]


@pytest.mark.parametrize("mode", ["evaluation", "prediction"])
def test_augmentation_leaves_evaluation_and_prediction_records_unchanged(mnist, mode):
    images, labels = mnist[0][:16], mnist[1][:16]
    plain = _parsed("mnist.mnist_functional", mode, images, labels)
    augmented = _parsed("mnist.mnist_augmented", mode, images, labels)
    for a, b in zip(tf.nest.flatten(augmented), tf.nest.flatten(plain)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_augmentation_changes_training_images_anew_each_pass_and_keeps_labels(mnist):
    images, labels = mnist[0][:16], mnist[1][:16]
    plain, plain_labels = _parsed("mnist.mnist_functional", "training", images, labels)
    spec = load_model_spec(str(ZOO), "mnist.mnist_augmented")
    records = [serialize(image, label) for image, label in zip(images, labels)]
    dataset = spec.dataset_fn(tf.data.Dataset.from_tensor_slices(records), "training",
                              metadata(records)).batch(16)
    (first, first_labels), (second, _) = next(iter(dataset)), next(iter(dataset))  # 2 passes
    np.testing.assert_array_equal(first_labels.numpy(), plain_labels.numpy())
    assert first.shape == plain.shape and first.dtype == plain.dtype
    assert 0.0 <= float(tf.reduce_min(first)) and float(tf.reduce_max(first)) <= 1.0
    for image in range(16):  # every record is changed, and differently on each pass
        assert not np.allclose(first[image], plain[image])
        assert not np.allclose(first[image], second[image])
    # A shift of at most 2 pixels keeps most of the digit where it was.
    overlap = tf.reduce_sum(tf.minimum(first, plain)) / tf.reduce_sum(plain)
    assert float(overlap) > 0.2


def test_the_augmented_module_trains(mnist):
    spec = load_model_spec(str(ZOO), "mnist.mnist_augmented")
    spec.check()
    _, losses = train(spec, batches(spec, *mnist))
    assert np.mean(losses[-3:]) < 0.8 * np.mean(losses[:3]), losses
