"""Wide & deep on the UCI Adult (census income) data, written to the model-zoo contract.

Predicts whether a person earns more than $50K a year from 14 census columns. Records are
CSV lines with a header (`metadata.column_names` gives the column order, so any order
works); the label is the `income` column (`>50K`, also `>50K.` or with stray spaces, is 1).

- **Wide**: a linear model over sparse tokens: each categorical column's value, the
  age bucket and the classic crosses (education x occupation, age bucket x education x
  occupation, native country x occupation), each token a dim-1 row of one PS-backed
  `Embedding` table summed with `combiner="sum"`.
- **Deep**: an 8-wide row per categorical value from a second PS-backed table (string ids,
  hashed, unbounded), concatenated with the six normalized numeric columns, through two
  ReLU layers.

The output is the probability of `>50K`. With 2 workers and 2 parameter servers it reaches
about 0.85 held-out accuracy in 3 epochs (the majority class is 0.76).

Train it with:

    elastic-keras data ../shared/data/adult.csv.gz --format csv --holdout-every 5 \\
        --shuffle --output adult
    elastic-keras train --model-zoo model_zoo --model-def census.wide_deep \\
        --training-data adult/train --validation-data adult/test \\
        --num-workers 2 --num-ps 2 --minibatch-size 128 --num-epochs 3 --output census-job

The exported model takes a dict of the 14 columns, named with `_` for `-`
(`marital_status`, ...): strings for the categorical ones, float32 for the numeric ones.
"""

import keras
import tensorflow as tf

from elastic_keras.layers import Embedding

LABEL = "income"
CATEGORICAL = (
    "workclass", "education", "marital_status", "occupation", "relationship", "race",
    "gender", "native_country",
)
# Numeric columns -> (transform, mean, stddev after the transform), computed once over the
# 48,842 rows of adult.csv.gz. Heavy-tailed columns are log1p-transformed first.
NUMERIC = {
    "age": ("identity", 38.6436, 13.7104),
    "fnlwgt": ("log1p", 11.983, 0.6308),
    "educational_num": ("identity", 10.0781, 2.5709),
    "capital_gain": ("log1p", 0.7285, 2.4455),
    "capital_loss": ("log1p", 0.351, 1.5862),
    "hours_per_week": ("identity", 40.4224, 12.3913),
}
AGE_BOUNDARIES = (18, 25, 30, 35, 40, 45, 50, 55, 60, 65)
CROSSES = (
    ("education", "occupation"),
    ("age_bucket", "education", "occupation"),
    ("native_country", "occupation"),
)
DEEP_DIM = 8


class Tokens(keras.layers.Layer):
    """Turns string columns into `[batch, k]` tokens "column=value" (and crosses of them).

    Args:
        columns: the names of the input columns, in order.
        crosses: tuples of column names; each adds one token joining their values.
    """

    def __init__(self, columns, crosses=(), **kwargs):
        super().__init__(**kwargs)
        self.columns = tuple(columns)
        self.crosses = tuple(tuple(c) for c in crosses)

    def call(self, values):
        by_name = dict(zip(self.columns, values))
        tokens = [tf.strings.join([name, "=", by_name[name]]) for name in self.columns]
        for cross in self.crosses:
            parts = []
            for name in cross:
                parts += [name, "=", by_name[name], "&"]
            tokens.append(tf.strings.join(parts[:-1]))
        return tf.stack(tokens, axis=-1)

    def compute_output_spec(self, values):
        count = len(self.columns) + len(self.crosses)
        return keras.KerasTensor(values[0].shape + (count,), dtype="string")


class AgeBucket(keras.layers.Layer):
    """The age as a bucket name ("0" .. "10") by `AGE_BOUNDARIES`."""

    def call(self, age):
        bucket = tf.raw_ops.Bucketize(input=age, boundaries=[float(b) for b in AGE_BOUNDARIES])
        return tf.strings.as_string(bucket)

    def compute_output_spec(self, age):
        return keras.KerasTensor(age.shape, dtype="string")


class Normalize(keras.layers.Layer):
    """Stacks the numeric columns into `[batch, len(NUMERIC)]`, transformed and standardized."""

    def call(self, values):
        columns = []
        for value, (transform, mean, stddev) in zip(values, NUMERIC.values()):
            value = tf.cast(value, tf.float32)
            if transform == "log1p":
                value = tf.math.log1p(tf.maximum(value, 0.0))
            columns.append((value - mean) / stddev)
        return tf.stack(columns, axis=-1)

    def compute_output_spec(self, values):
        return keras.KerasTensor(values[0].shape + (len(NUMERIC),), dtype="float32")


def custom_model():
    """The wide & deep model: a dict of the 14 columns -> probability of income > 50K."""
    inputs = {name: keras.Input(shape=(), dtype="string", name=name) for name in CATEGORICAL}
    inputs.update({name: keras.Input(shape=(), dtype="float32", name=name) for name in NUMERIC})
    categorical = [inputs[name] for name in CATEGORICAL]
    age_bucket = AgeBucket(name="age_bucket")(inputs["age"])

    wide_tokens = Tokens(CATEGORICAL + ("age_bucket",), CROSSES, name="wide_tokens")(
        categorical + [age_bucket])
    wide = Embedding(1, combiner="sum", embeddings_initializer="zeros", name="wide")(wide_tokens)

    deep_tokens = Tokens(CATEGORICAL, name="deep_tokens")(categorical)
    deep_rows = Embedding(DEEP_DIM, name="deep")(deep_tokens)  # [batch, 8, DEEP_DIM]
    numeric = Normalize(name="numeric")([inputs[name] for name in NUMERIC])
    x = keras.layers.Concatenate()([keras.layers.Flatten()(deep_rows), numeric])
    x = keras.layers.Dense(64, activation="relu")(x)
    x = keras.layers.Dense(32, activation="relu")(x)
    deep = keras.layers.Dense(1)(x)

    logit = keras.layers.Add(name="logit")([wide, deep])
    probability = keras.layers.Activation("sigmoid", name="probability")(logit)
    return keras.Model(inputs, probability, name="census_wide_deep")


def loss(labels, predictions):
    """Mean binary cross-entropy of 0/1 `labels` against the predicted probabilities."""
    labels = tf.reshape(tf.cast(labels, tf.float32), [-1, 1])
    return tf.reduce_mean(keras.losses.binary_crossentropy(labels, predictions))


def optimizer():
    """Adam with learning rate 0.005 (applied sparsely to the embedding rows on the PS)."""
    return keras.optimizers.Adam(learning_rate=0.005)


def dataset_fn(dataset, mode, metadata):
    """Parses CSV lines into a dict of columns (and the 0/1 label unless predicting).

    Args:
        dataset: a `tf.data.Dataset` of CSV lines (no header), one per element.
        mode: `"training"`, `"evaluation"` or `"prediction"`.
        metadata: the record file's metadata; `column_names` is its CSV header.

    Returns:
        A dataset of `(features, label)` pairs (the label of shape `[1]`, like the model's
        output), or of features alone when predicting.
    """
    names = [name.strip().replace("-", "_") for name in metadata.column_names]
    wanted = set(CATEGORICAL) | set(NUMERIC)
    missing = sorted(wanted - set(names))
    if missing:
        raise ValueError(
            f"census.wide_deep needs the columns {sorted(wanted)} (with '-' or '_'). "
            f"Received: column_names={list(metadata.column_names)}, missing {missing}"
        )
    defaults = [[0.0] if name in NUMERIC else [""] for name in names]

    def parse(line):
        fields = dict(zip(names, tf.io.decode_csv(line, defaults)))
        features = {name: tf.strings.strip(fields[name]) for name in CATEGORICAL}
        features.update({name: fields[name] for name in NUMERIC})
        if mode == "prediction":
            return features
        income = tf.strings.strip(fields[LABEL])
        label = tf.cast(tf.strings.regex_full_match(income, r">50K\.?"), tf.int64)
        return features, tf.reshape(label, [1])

    return dataset.map(parse, num_parallel_calls=tf.data.AUTOTUNE)


def eval_metrics_fn():
    """Accuracy at 0.5 and ROC AUC."""
    return {"accuracy": keras.metrics.BinaryAccuracy(), "auc": keras.metrics.AUC()}
