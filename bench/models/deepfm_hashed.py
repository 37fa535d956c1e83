"""DeepFM with its ids hashed into tables of a fixed number of rows, to the model-zoo contract.

`model_zoo/deepfm/deepfm.py` with one change: the 26 int64 ids of an example are first
hashed into `[0, rows)` (`id mod rows`), so its two tables, `fm_linear` (dim 1) and
`fm_factors` (dim 16), have `rows` rows, as a table of a fixed size in plain Keras or
TensorFlow must. Records, loss (binary cross-entropy), optimizer (Adam, learning rate
0.002) and input pipeline are the zoo module's.

`custom_model()` (what elastic_keras trains) uses `elastic_keras.layers.Embedding` with
`input_dim=rows`: the tables live on the parameter servers and a row exists once an id is
used. `build_model(rows, plain=True)` builds the same model with `keras.layers.Embedding`
tables, for plain Keras `fit`. The number of rows is read from the environment variable
`BENCH_TABLE_ROWS` (default 1,000,000), so that every role of a job builds the same model.
`BENCH_OPTIMIZER` picks the optimizer by name (`OPTIMIZERS`): `adam` (the zoo module's, the
default), `adagrad` (learning rate 0.05; TensorFlow applies it sparsely too, so the peers
update only the rows a batch touches) or `sgd` (learning rate 0.05, no per-row slots: what
lets a 100M-row table fit a 23 GB machine, `bench.scaling`). The tf_keras rebuild for
ParameterServerStrategy (`bench.pss_models`) reads the same variable.
"""

import os

import keras
import tensorflow as tf

from elastic_keras.layers import Embedding
from model_zoo.deepfm.deepfm import (  # noqa: F401 (the contract's other names)
    FACTOR_DIM, NUM_DENSE, NUM_FIELDS, FactorInteractions, LogCounts, batch_dataset_fn,
    eval_metrics_fn, loss,
)

ROWS_VARIABLE = "BENCH_TABLE_ROWS"
OPTIMIZER_VARIABLE = "BENCH_OPTIMIZER"
DEFAULT_ROWS = 1_000_000
# name -> (class in keras.optimizers and tf_keras.optimizers, learning rate); "adam" is
# the zoo module's optimizer.
OPTIMIZERS = {"adam": ("Adam", 0.002), "adagrad": ("Adagrad", 0.05), "sgd": ("SGD", 0.05)}
FACTOR_STDDEV = 0.01


class HashIds(keras.layers.Layer):
    """`id mod rows`: int64 ids from the whole int64 range into `[0, rows)`."""

    def __init__(self, rows, **kwargs):
        super().__init__(**kwargs)
        self.rows = int(rows)

    def call(self, ids):
        return tf.math.floormod(tf.cast(ids, tf.int64), self.rows)

    def get_config(self):
        return {**super().get_config(), "rows": self.rows}


class SumFields(keras.layers.Layer):
    """`[batch, fields, 1]` -> `[batch, 1]`: the sum over the fields."""

    def call(self, weights):
        return tf.reduce_sum(weights, axis=1)


def table_rows():
    """The tables' row count, from `BENCH_TABLE_ROWS`."""
    return int(os.environ.get(ROWS_VARIABLE, DEFAULT_ROWS))


def build_model(rows, plain=False):
    """DeepFM over `rows`-row tables: parameter-server tables, or plain Keras ones."""
    dense = keras.Input(shape=(NUM_DENSE,), dtype="float32", name="dense")
    cat = keras.Input(shape=(NUM_FIELDS,), dtype="int64", name="cat")
    ids = HashIds(rows, name="hash_ids")(cat)
    counts = LogCounts(name="log_counts")(dense)
    factor_init = keras.initializers.RandomNormal(stddev=FACTOR_STDDEV)
    if plain:
        linear = SumFields(name="sum_linear")(keras.layers.Embedding(
            rows, 1, embeddings_initializer="zeros", name="fm_linear")(ids))
        factors = keras.layers.Embedding(rows, FACTOR_DIM, embeddings_initializer=factor_init,
                                         name="fm_factors")(ids)
    else:
        linear = Embedding(1, input_dim=rows, combiner="sum", embeddings_initializer="zeros",
                           name="fm_linear")(ids)
        factors = Embedding(FACTOR_DIM, input_dim=rows, embeddings_initializer=factor_init,
                            name="fm_factors")(ids)
    first_order = keras.layers.Add(name="first_order")(
        [linear, keras.layers.Dense(1, name="dense_linear")(counts)])
    second_order = FactorInteractions(name="second_order")(factors)
    x = keras.layers.Concatenate()([keras.layers.Flatten()(factors), counts])
    x = keras.layers.Dense(128, activation="relu", name="hidden_1")(x)
    x = keras.layers.Dense(64, activation="relu", name="hidden_2")(x)
    deep = keras.layers.Dense(1, name="deep")(x)
    logit = keras.layers.Add(name="logit")([first_order, second_order, deep])
    probability = keras.layers.Activation("sigmoid", name="probability")(logit)
    return keras.Model({"dense": dense, "cat": cat}, probability, name="deepfm_hashed")


def custom_model():
    """DeepFM over `BENCH_TABLE_ROWS`-row tables on the parameter servers."""
    return build_model(table_rows())


def optimizer_choice():
    """(class name, learning rate) of the optimizer `BENCH_OPTIMIZER` names.

    Raises:
        ValueError: it names none of `OPTIMIZERS`.
    """
    name = os.environ.get(OPTIMIZER_VARIABLE, "adam")
    if name not in OPTIMIZERS:
        raise ValueError(f"{OPTIMIZER_VARIABLE} must be one of {sorted(OPTIMIZERS)}. "
                         f"Received: {name!r}")
    return OPTIMIZERS[name]


def optimizer():
    """The optimizer `BENCH_OPTIMIZER` names (default: Adam, as the zoo module's)."""
    name, learning_rate = optimizer_choice()
    return getattr(keras.optimizers, name)(learning_rate=learning_rate)
