"""The benchmark models rebuilt with tf_keras layers, for ParameterServerStrategy.

Keras 3 does not run under `tf.distribute.experimental.ParameterServerStrategy`, so the
strategy's side of a comparison builds each architecture again from tf_keras (Keras 2)
layers: the same layers, sizes, initializers, loss and optimizer (with its hyperparameters)
as the Keras 3 module the other side trains, and the same input pipeline (the module's own
input function, plain TensorFlow, as a worker applies it: `bench.common.minibatches`).
`MODELS[name]` gives a `PSSModel`:

- `mnist_cnn`: `model_zoo/mnist/mnist_functional.py`;
- `mnist_mlp`: `bench/models/mnist_mlp.py`;
- `deepfm`: `bench/models/deepfm_hashed.py` with plain tables of `rows` rows (sharded
  across the parameter servers by the strategy's variable partitioner).
"""

import dataclasses
import typing


@dataclasses.dataclass(frozen=True)
class PSSModel:
    """How to build one benchmark model in tf_keras, and where its records' parser is.

    Attributes:
        build: `build(rows) -> tf_keras.Model` (`rows` is ignored by the dense models).
        loss: `loss() -> tf_keras loss` with the Keras 3 module's reduction (the mean).
        optimizer: `optimizer() -> tf_keras optimizer`, the module's class and settings.
        minibatches: `minibatches(records, batch)`: minibatches of a dataset of serialized
            records through the Keras 3 module's input function (plain TensorFlow).
    """

    build: typing.Callable
    loss: typing.Callable
    optimizer: typing.Callable
    minibatches: typing.Callable


def _mnist_cnn(rows=None):
    import tf_keras as k

    inputs = k.Input(shape=(28, 28, 1), name="image")
    x = k.layers.Conv2D(32, 3, activation="relu")(inputs)
    x = k.layers.Conv2D(64, 3, activation="relu")(x)
    x = k.layers.MaxPooling2D(2)(x)
    x = k.layers.Dropout(0.1)(x)
    x = k.layers.Flatten()(x)
    x = k.layers.Dense(128, activation="relu")(x)
    outputs = k.layers.Dense(10, name="logits")(x)
    return k.Model(inputs, outputs, name="mnist_functional")


def _mnist_mlp(rows=None):
    import tf_keras as k

    from bench.models.mnist_mlp import HIDDEN

    inputs = k.Input(shape=(28, 28, 1), name="image")
    x = k.layers.Flatten()(inputs)
    for units in HIDDEN:
        x = k.layers.Dense(units, activation="relu")(x)
    outputs = k.layers.Dense(10, name="logits")(x)
    return k.Model(inputs, outputs, name="mnist_mlp")


def _deepfm(rows):
    import tensorflow as tf
    import tf_keras as k

    from bench.models.deepfm_hashed import FACTOR_DIM, FACTOR_STDDEV, NUM_DENSE, NUM_FIELDS

    dense = k.Input(shape=(NUM_DENSE,), dtype="float32", name="dense")
    cat = k.Input(shape=(NUM_FIELDS,), dtype="int64", name="cat")
    ids = k.layers.Lambda(lambda c: tf.math.floormod(c, rows), name="hash_ids")(cat)
    counts = k.layers.Lambda(lambda d: tf.math.log1p(tf.maximum(d, 0.0)),
                             name="log_counts")(dense)
    linear = k.layers.Lambda(lambda w: tf.reduce_sum(w, axis=1), name="sum_linear")(
        k.layers.Embedding(rows, 1, embeddings_initializer="zeros", name="fm_linear")(ids))
    factors = k.layers.Embedding(
        rows, FACTOR_DIM, embeddings_initializer=k.initializers.RandomNormal(stddev=FACTOR_STDDEV),
        name="fm_factors")(ids)

    def interactions(v):
        summed = tf.reduce_sum(v, axis=1)
        return 0.5 * tf.reduce_sum(tf.square(summed) - tf.reduce_sum(tf.square(v), axis=1),
                                   axis=1, keepdims=True)

    first_order = k.layers.Add(name="first_order")(
        [linear, k.layers.Dense(1, name="dense_linear")(counts)])
    second_order = k.layers.Lambda(interactions, name="second_order")(factors)
    x = k.layers.Concatenate()([k.layers.Flatten()(factors), counts])
    x = k.layers.Dense(128, activation="relu", name="hidden_1")(x)
    x = k.layers.Dense(64, activation="relu", name="hidden_2")(x)
    deep = k.layers.Dense(1, name="deep")(x)
    logit = k.layers.Add(name="logit")([first_order, second_order, deep])
    probability = k.layers.Activation("sigmoid", name="probability")(logit)
    return k.Model({"dense": dense, "cat": cat}, probability, name="deepfm_hashed")


def _sparse_categorical_loss():
    import tf_keras as k

    return k.losses.SparseCategoricalCrossentropy(from_logits=True)


def _binary_loss():
    import tf_keras as k

    return k.losses.BinaryCrossentropy()


def _adam(learning_rate):
    def make():
        import tf_keras as k

        return k.optimizers.Adam(learning_rate=learning_rate)

    return make


def _deepfm_optimizer():
    """The optimizer `BENCH_OPTIMIZER` names, as the Keras 3 module builds it
    (`deepfm_hashed.optimizer_choice`)."""
    import tf_keras as k

    from bench.models.deepfm_hashed import optimizer_choice

    name, learning_rate = optimizer_choice()
    return getattr(k.optimizers, name)(learning_rate=learning_rate)


def _minibatches(module):
    def minibatches(records, batch):
        from bench.common import minibatches

        return minibatches(module, records, batch)

    return minibatches


MODELS = {
    "mnist_cnn": PSSModel(_mnist_cnn, _sparse_categorical_loss, _adam(0.001),
                          _minibatches("model_zoo.mnist.mnist_functional")),
    "mnist_mlp": PSSModel(_mnist_mlp, _sparse_categorical_loss, _adam(0.001),
                          _minibatches("model_zoo.mnist.mnist_functional")),
    "deepfm": PSSModel(_deepfm, _binary_loss, _deepfm_optimizer,
                       _minibatches("model_zoo.deepfm.deepfm")),
}
