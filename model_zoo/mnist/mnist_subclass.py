"""The MNIST CNN of `mnist_functional`, written as a subclassed `keras.Model`.

It shares the records, `dataset_fn`, `loss`, `optimizer` and metrics of `mnist_functional`
(imported relatively, so this module loads both as `mnist.mnist_subclass` from the model
zoo and as `model_zoo.mnist.mnist_subclass`). Only the model differs.

Train it with:

    elastic-keras train --model-zoo model_zoo --model-def mnist.mnist_subclass \\
        --training-data mnist_train.tfrecord
"""

import keras

from .mnist_functional import (  # noqa: F401 (re-exported for the model-zoo contract)
    NUM_CLASSES,
    PredictionOutputsProcessor,
    dataset_fn,
    eval_metrics_fn,
    loss,
    optimizer,
)


class MnistModel(keras.Model):
    """Two convolutions, a max-pool and two dense layers; `call` returns logits."""

    def __init__(self, num_classes=NUM_CLASSES, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = keras.layers.Conv2D(32, 3, activation="relu")
        self.conv2 = keras.layers.Conv2D(64, 3, activation="relu")
        self.pool = keras.layers.MaxPooling2D(2)
        self.dropout = keras.layers.Dropout(0.1)
        self.flatten = keras.layers.Flatten()
        self.hidden = keras.layers.Dense(128, activation="relu")
        self.logits = keras.layers.Dense(num_classes)

    def call(self, inputs, training=False):
        x = self.conv1(inputs)
        x = self.conv2(x)
        x = self.pool(x)
        x = self.dropout(x, training=training)
        x = self.flatten(x)
        x = self.hidden(x)
        return self.logits(x)


def custom_model():
    """A fresh, unbuilt `MnistModel`."""
    return MnistModel(name="mnist_subclass")
