"""A functional Keras CNN for MNIST, written to the model-zoo contract.

Records are serialized `tf.train.Example`s with two int64 features: `image`, the 784 pixel
values 0-255 of a 28x28 image in row-major order, and `label`, the digit 0-9 (not needed
when predicting). The model outputs logits.

Train it with:

    elastic-keras train --model-zoo model_zoo --model-def mnist.mnist_functional \\
        --training-data mnist_train.tfrecord --validation-data mnist_test.tfrecord
"""

import logging

import keras
import numpy as np
import tensorflow as tf

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
MAX_PIXEL = 255.0

_IMAGE = tf.io.FixedLenFeature([IMAGE_SHAPE[0] * IMAGE_SHAPE[1]], tf.int64)
_LABEL = tf.io.FixedLenFeature([], tf.int64)

logger = logging.getLogger(__name__)


def custom_model():
    """Two convolutions, a max-pool and two dense layers; returns a `keras.Model` of logits."""
    inputs = keras.Input(shape=IMAGE_SHAPE, name="image")
    x = keras.layers.Conv2D(32, 3, activation="relu")(inputs)
    x = keras.layers.Conv2D(64, 3, activation="relu")(x)
    x = keras.layers.MaxPooling2D(2)(x)
    x = keras.layers.Dropout(0.1)(x)
    x = keras.layers.Flatten()(x)
    x = keras.layers.Dense(128, activation="relu")(x)
    outputs = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    return keras.Model(inputs, outputs, name="mnist_functional")


def loss(labels, predictions):
    """Mean sparse categorical cross-entropy of integer `labels` against logits."""
    labels = tf.reshape(labels, [-1])
    return tf.reduce_mean(
        keras.losses.sparse_categorical_crossentropy(labels, predictions, from_logits=True)
    )


def optimizer():
    """Adam with learning rate 0.001."""
    return keras.optimizers.Adam(learning_rate=0.001)


def dataset_fn(dataset, mode, metadata):
    """Parses each record into a scaled 28x28x1 image (and its label unless predicting).

    Args:
        dataset: a `tf.data.Dataset` of serialized `tf.train.Example`s, one per element.
        mode: `"training"`, `"evaluation"` or `"prediction"`.
        metadata: the record file's metadata (unused here).

    Returns:
        A dataset of `(image, label)` pairs, or of images alone when `mode` is
        `"prediction"`. It is neither batched nor shuffled: the worker does that.
    """
    del metadata
    features = {"image": _IMAGE} if mode == "prediction" else {"image": _IMAGE, "label": _LABEL}

    def parse(record):
        example = tf.io.parse_single_example(record, features)
        image = tf.reshape(tf.cast(example["image"], tf.float32) / MAX_PIXEL, IMAGE_SHAPE)
        if mode == "prediction":
            return image
        return image, example["label"]

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def eval_metrics_fn():
    """Accuracy of the argmax of the logits."""
    return {"accuracy": keras.metrics.SparseCategoricalAccuracy()}


class PredictionOutputsProcessor:
    """Logs the predicted digit of each image in a batch of predictions."""

    def process(self, predictions, worker_id):
        digits = np.argmax(np.asarray(predictions), axis=-1)
        logger.info("Worker %s predicted digits: %s", worker_id, digits.tolist())
        return digits
