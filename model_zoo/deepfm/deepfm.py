"""DeepFM (Guo et al., 2017) over a hashed feature space, written to the model-zoo contract.

Records are `tf.train.Example`s as `model_zoo/deepfm/generate.py` writes them (the layout of
Criteo's display-advertising logs): `dense`, 13 float counts; `cat`, 26 int64 ids, already
hashed from (field, value) into the whole int64 range; `label`, 1 for a click.

The 26 ids of an example index two unbounded PS-backed tables (`input_dim=None`), shared by
every field, so an id never seen before simply gets a new row:

- `fm_linear` (dim 1): the FM's first-order weights, summed, plus a linear term of the counts;
- `fm_factors` (dim `FACTOR_DIM`): the FM's latent vectors; their pairwise dot products give
  the second-order term, and, flattened with the counts, the input of the DNN.

The output is the click probability. Exported, each table becomes a hash-table lookup of
its trained rows, with a zero row for ids never trained.

Train it with:

    python -m model_zoo.deepfm.generate --output clicks/train --rows 200000 --num-shards 4
    python -m model_zoo.deepfm.generate --output clicks/test --rows 20000 --seed 1
    elastic-keras train --model-zoo model_zoo --model-def deepfm.deepfm \\
        --training-data clicks/train --validation-data clicks/test \\
        --num-workers 2 --num-ps 2 --minibatch-size 256 --num-epochs 2 --output deepfm-job
"""

import keras
import tensorflow as tf

from elastic_keras.layers import Embedding

NUM_DENSE = 13
NUM_FIELDS = 26
FACTOR_DIM = 16

_FEATURES = {
    "dense": tf.io.FixedLenFeature([NUM_DENSE], tf.float32),
    "cat": tf.io.FixedLenFeature([NUM_FIELDS], tf.int64),
}
_LABEL = {"label": tf.io.FixedLenFeature([], tf.int64)}


class LogCounts(keras.layers.Layer):
    """`log1p` of non-negative counts (negative values count as 0)."""

    def call(self, counts):
        return tf.math.log1p(tf.maximum(tf.cast(counts, tf.float32), 0.0))


class FactorInteractions(keras.layers.Layer):
    """The FM's second-order term: the sum of pairwise dot products of `[batch, fields, k]`
    vectors, computed as 0.5 * ((sum v)^2 - sum v^2), giving `[batch, 1]`."""

    def call(self, factors):
        summed = tf.reduce_sum(factors, axis=1)
        squares = tf.reduce_sum(tf.square(factors), axis=1)
        return 0.5 * tf.reduce_sum(tf.square(summed) - squares, axis=1, keepdims=True)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], 1)


def custom_model():
    """DeepFM: `{"dense": [batch, 13] floats, "cat": [batch, 26] int64 ids}` -> P(click)."""
    dense = keras.Input(shape=(NUM_DENSE,), dtype="float32", name="dense")
    cat = keras.Input(shape=(NUM_FIELDS,), dtype="int64", name="cat")
    counts = LogCounts(name="log_counts")(dense)

    first_order = keras.layers.Add(name="first_order")([
        Embedding(1, input_dim=None, combiner="sum", embeddings_initializer="zeros",
                  name="fm_linear")(cat),
        keras.layers.Dense(1, name="dense_linear")(counts),
    ])
    factors = Embedding(FACTOR_DIM, input_dim=None,
                        embeddings_initializer=keras.initializers.RandomNormal(stddev=0.01),
                        name="fm_factors")(cat)  # [batch, 26, FACTOR_DIM]
    second_order = FactorInteractions(name="second_order")(factors)

    x = keras.layers.Concatenate()([keras.layers.Flatten()(factors), counts])
    x = keras.layers.Dense(128, activation="relu", name="hidden_1")(x)
    x = keras.layers.Dense(64, activation="relu", name="hidden_2")(x)
    deep = keras.layers.Dense(1, name="deep")(x)

    logit = keras.layers.Add(name="logit")([first_order, second_order, deep])
    probability = keras.layers.Activation("sigmoid", name="probability")(logit)
    return keras.Model({"dense": dense, "cat": cat}, probability, name="deepfm")


def loss(labels, predictions):
    """Mean binary cross-entropy of 0/1 click `labels` against the predicted probabilities."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
    return tf.reduce_mean(keras.losses.binary_crossentropy(labels, predictions))


def optimizer():
    """Adam with learning rate 0.002 (applied sparsely to the embedding rows on the PS)."""
    return keras.optimizers.Adam(learning_rate=0.002)


def batch_dataset_fn(dataset, mode, metadata):
    """Parses each minibatch of `tf.train.Example`s at once into `{"dense", "cat"}` (and the
    labels unless predicting): one `tf.io.parse_example` per minibatch, which runs an order of
    magnitude faster than parsing each record on its own.

    Args:
        dataset: a `tf.data.Dataset` of minibatches of serialized `tf.train.Example`s (1-D
            string tensors).
        mode: `"training"`, `"evaluation"` or `"prediction"`.
        metadata: the record file's metadata (unused).

    Returns:
        A dataset of `(features, labels)` minibatches (labels of shape `[batch, 1]`, like the
        model's output), or of features alone when predicting.
    """
    del metadata
    spec = _FEATURES if mode == "prediction" else {**_FEATURES, **_LABEL}

    def parse(records):
        examples = tf.io.parse_example(records, spec)
        features = {"dense": examples["dense"], "cat": examples["cat"]}
        if mode == "prediction":
            return features
        return features, tf.reshape(examples["label"], [-1, 1])

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def eval_metrics_fn():
    """ROC AUC, log loss and accuracy at 0.5."""
    return {
        "auc": keras.metrics.AUC(),
        "logloss": keras.metrics.BinaryCrossentropy(),
        "accuracy": keras.metrics.BinaryAccuracy(),
    }
