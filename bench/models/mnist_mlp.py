"""An MNIST MLP, written to the model-zoo contract: the records, loss, optimizer and input
pipeline of `model_zoo/mnist/mnist_functional.py`, with two hidden dense layers instead of
the convolutions (535k parameters, 2.1 MB: a model whose step is cheap next to moving it).

    elastic-keras train --model-zoo . --model-def bench.models.mnist_mlp --training-data ...
"""

import keras

from model_zoo.mnist.mnist_functional import (  # noqa: F401 (the contract's other names)
    IMAGE_SHAPE, NUM_CLASSES, dataset_fn, eval_metrics_fn, loss, optimizer,
)

HIDDEN = (512, 256)


def custom_model():
    """Flatten, dense 512 relu, dense 256 relu, dense 10 logits."""
    inputs = keras.Input(shape=IMAGE_SHAPE, name="image")
    x = keras.layers.Flatten()(inputs)
    for units in HIDDEN:
        x = keras.layers.Dense(units, activation="relu")(x)
    outputs = keras.layers.Dense(NUM_CLASSES, name="logits")(x)
    return keras.Model(inputs, outputs, name="mnist_mlp")
