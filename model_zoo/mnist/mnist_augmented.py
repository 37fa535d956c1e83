"""The MNIST CNN of `mnist_functional`, trained on augmented images.

In training mode only, `dataset_fn` shifts each image by up to 2 pixels in each direction (a
random crop of the image padded by 2), changes its contrast a little and adds faint noise;
evaluation and prediction see every record as it is. The augmentation is random per record
and per epoch, and runs on the worker inside the input pipeline, so it needs no change to
the model or the job.

Train it with:

    elastic-keras train --model-zoo model_zoo --model-def mnist.mnist_augmented \\
        --training-data mnist_train.tfrecord --validation-data mnist_test.tfrecord
"""

import tensorflow as tf

from model_zoo.mnist.mnist_functional import (  # noqa: F401 - the module's contract
    IMAGE_SHAPE, PredictionOutputsProcessor, custom_model, dataset_fn as _parse,
    eval_metrics_fn, loss, optimizer,
)

SHIFT = 2          # pixels an image may move in each direction
CONTRAST = 0.2     # contrast factor drawn from [1 - CONTRAST, 1 + CONTRAST]
NOISE_STDDEV = 0.02


def augment(image, seeds):
    """A randomly shifted, contrasted and noisy copy of a 28x28x1 image in [0, 1]; `seeds`
    holds three stateless-random seeds, shape [2, 3]."""
    padded = tf.pad(image, [[SHIFT, SHIFT], [SHIFT, SHIFT], [0, 0]])
    image = tf.image.stateless_random_crop(padded, IMAGE_SHAPE, seeds[:, 0])
    image = tf.image.stateless_random_contrast(image, 1.0 - CONTRAST, 1.0 + CONTRAST,
                                               seeds[:, 1])
    image += tf.random.stateless_normal(IMAGE_SHAPE, seeds[:, 2], stddev=NOISE_STDDEV)
    return tf.clip_by_value(image, 0.0, 1.0)


def dataset_fn(dataset, mode, metadata):
    """`mnist_functional`'s records, augmented in training mode only (see the module)."""
    parsed = _parse(dataset, mode, metadata)
    if mode != "training":
        return parsed
    # A generator's state moves on with every record, across passes over the dataset: each
    # epoch sees each record augmented anew (seeded ops would repeat themselves per pass).
    generator = tf.random.Generator.from_non_deterministic_state()
    return parsed.map(lambda image, label: (augment(image, generator.make_seeds(3)), label),
                      num_parallel_calls=tf.data.AUTOTUNE)
