"""`Embedding`: a Keras embedding layer whose table lives on the parameter servers.

The layer holds no weights while it trains. Where its rows come from depends on when it is
called:

- inside a `LookupContext` (a worker's step): from the parameter servers, through the
  context's `lookup_fn` (see `lookup_context.py`);
- after `load_table(ids, rows)` (export): from plain TensorFlow state that the layer then
  owns: a `[input_dim, output_dim]` weight for a bounded table, a hash table from id to row
  for an unbounded one, so that `model.export()` writes a SavedModel that serves without
  this package;
- otherwise: a zero row per id. This happens only while a worker or the exporter builds the
  model (its first call, to create the other layers' variables), where the values do not
  matter.
"""

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.embedding_lifecycle import check_lifecycle
from elastic_keras.layers.id_tensors import (
    check_id_range, check_table_rows, gather_rows, padding, segments,
)
from elastic_keras.layers.lookup_context import lookup_unique

COMBINERS = ("sum", "mean", "sqrtn")

# `tf.strings.to_hash_bucket_fast` maps a string into [0, num_buckets); this many buckets
# spread strings over every non-negative int64.
_STRING_BUCKETS = 2**63 - 1


@keras.saving.register_keras_serializable(package="elastic_keras")
class Embedding(keras.layers.Layer):
    """Turns int64 or string ids into dense vectors from a parameter-server table.

    The table is sparse and lazy: a row exists once an id is first looked up, and the id
    space is unbounded unless `input_dim` bounds it. Ids may be any int64 value; string ids
    are hashed in the graph with `tf.strings.to_hash_bucket_fast` (into `[0, input_dim)` when
    `input_dim` is set, into the non-negative int64s otherwise).

    Inputs may be dense (`[batch]`, `[batch, n]`, ...), `tf.RaggedTensor` or
    `tf.SparseTensor`:

    - without `combiner`, dense ids of shape `s` give vectors of shape `s + [output_dim]`
      (ragged and sparse ids need a combiner);
    - with `combiner` ("sum", "mean" or "sqrtn"), the vectors along the last axis of the
      ids are combined: `[batch, n]` dense, `[batch, (n)]` ragged and `[batch, n]` sparse
      ids all give `[batch, output_dim]`. Rank-1 ids count as one id per example. An example
      with no ids (an empty ragged or sparse row) gives zeros.

    Args:
        output_dim: the size of each row, a positive int.
        input_dim: None for an unbounded id space, or a positive int: the ids must then lie
            in `[0, input_dim)` (checked in the graph).
        embeddings_initializer: a Keras initializer (name, config or instance). The
            parameter servers create each row with it, deterministically per (table, id).
        combiner: None, "sum", "mean" or "sqrtn".
        mask_zero: whether id 0 (the empty string for string ids) is padding. Without a
            combiner, `compute_mask` returns `ids != 0`; with one, padding ids are left
            out of the combination (and not looked up).
        embeddings_regularizer: a Keras regularizer applied to the distinct rows each call
            looks up; the penalty is added with `add_loss`, so it appears in `model.losses`.
        table: the name of the parameter-server table; defaults to the layer's name.
            Layers with the same `table` share its rows and must agree on `output_dim`,
            `input_dim`, initializer, dtype and the lifecycle arguments below.
        admit_after: an id gets a row once it was looked up in training this many times
            (at most 255); until then it reads zeros and its gradients are dropped (the
            job's summary counts them). None: the job's `--embedding-admit-after`.
        admit_probability: or each training lookup of an id without a row gives it one with
            this probability, in (0, 1]. None: the job's `--embedding-admit-probability`.
            Setting either admission argument replaces the job's admission for this table.
        idle_steps: rows not used in training for this many model versions of their
            parameter server are evicted (0: never). None: `--embedding-idle-steps`.
        idle_seconds: or for this many seconds (0: never). None: `--embedding-idle-seconds`.
        max_rows: the most rows the table holds over all parameter servers; a full table
            evicts its least recently used rows (0: no bound). None: `--embedding-max-rows`.
            An evicted id that returns goes through admission again.
        **kwargs: base `keras.layers.Layer` arguments (`name`, `dtype`, `trainable`).

    Raises:
        ValueError: an argument breaks its rule.

    Example:

        >>> ids = keras.Input(shape=(None,), ragged=True, dtype="int64")
        >>> vectors = Embedding(8, combiner="mean", table="user")(ids)
        >>> vectors.shape
        (None, 8)
    """

    def __init__(
        self,
        output_dim,
        input_dim=None,
        embeddings_initializer="uniform",
        combiner=None,
        mask_zero=False,
        embeddings_regularizer=None,
        table=None,
        admit_after=None,
        admit_probability=None,
        idle_steps=None,
        max_rows=None,
        idle_seconds=None,
        **kwargs,
    ):
        _check_positive_int("output_dim", output_dim)
        if input_dim is not None:
            _check_positive_int("input_dim", input_dim)
        if combiner not in (None,) + COMBINERS:
            raise ValueError(
                f"`combiner` must be None or one of {COMBINERS}. Received: combiner={combiner!r}"
            )
        if table is not None and (not isinstance(table, str) or not table):
            raise ValueError(
                f"`table` must be None or a non-empty string. Received: table={table!r}"
            )
        self.lifecycle = _check_lifecycle(
            admit_after=admit_after, admit_probability=admit_probability,
            idle_steps=idle_steps, max_rows=max_rows, idle_seconds=idle_seconds)
        super().__init__(**kwargs)
        self.output_dim = output_dim
        self.input_dim = input_dim
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.embeddings_regularizer = keras.regularizers.get(embeddings_regularizer)
        self.combiner = combiner
        self.mask_zero = bool(mask_zero)
        self.table = table or self.name
        self.supports_masking = self.mask_zero and combiner is None
        self.autocast = False
        self._loaded = False
        self.build()

    def build(self, input_shape=None):
        # Nothing to create: the rows live on the parameter servers until `load_table`.
        self.built = True

    @property
    def initializer_config(self):
        """The serialized initializer, as the parameter servers need it to create rows."""
        return keras.initializers.serialize(self.embeddings_initializer)

    @property
    def loaded(self):
        """Whether `load_table` turned this layer into plain TensorFlow."""
        return self._loaded

    # -- forward pass ---------------------------------------------------------------------

    def call(self, inputs):
        if isinstance(inputs, (tf.RaggedTensor, tf.SparseTensor)) and self.combiner is None:
            raise self._needs_combiner_error(type(inputs).__name__)
        if self.combiner is None:
            return self._embed(inputs)
        return self._combine(inputs)

    def _embed(self, inputs):
        """Dense ids of shape `s` -> vectors of shape `s + [output_dim]`."""
        ids = self._to_ids(inputs)
        rows, index = self._rows(ids)
        return tf.cast(gather_rows(rows, index, ids, self.output_dim),
                       self.compute_dtype)

    def _combine(self, inputs):
        """Combines the vectors of the ids along the last axis of the ids."""
        values, segment_ids, num_segments, finish = segments(inputs)
        if self.mask_zero:
            keep = tf.not_equal(values, padding(values.dtype))
            values = tf.boolean_mask(values, keep)
            segment_ids = tf.boolean_mask(segment_ids, keep)
        rows, index = self._rows(self._to_ids(values))
        vectors = tf.gather(rows, index)
        combined = tf.math.unsorted_segment_sum(vectors, segment_ids, num_segments)
        if self.combiner != "sum":
            counts = tf.math.unsorted_segment_sum(
                tf.ones_like(segment_ids, dtype=combined.dtype), segment_ids, num_segments)
            if self.combiner == "sqrtn":
                counts = tf.sqrt(counts)
            combined = tf.math.divide_no_nan(combined, counts[:, tf.newaxis])
        return tf.cast(finish(combined), self.compute_dtype)

    def _to_ids(self, values):
        """Raw ids (int, float or string) as int64 ids, range-checked when bounded."""
        values = tf.convert_to_tensor(values)
        if values.dtype == tf.string:
            return tf.strings.to_hash_bucket_fast(values, self.input_dim or _STRING_BUCKETS)
        if not (values.dtype.is_integer or values.dtype.is_floating):
            raise ValueError(
                f"Embedding {self.name!r} takes integer or string ids. "
                f"Received: dtype={values.dtype.name}"
            )
        return check_id_range(tf.cast(values, tf.int64), self.input_dim, self.name)

    def _rows(self, ids):
        """(rows of the distinct ids, index of each id's row), regularized."""
        rows, index = lookup_unique(
            self.table, ids, self.output_dim, self.variable_dtype, self._rows_without_ps)
        if self.embeddings_regularizer is not None:
            self.add_loss(self.embeddings_regularizer(rows))
        return rows, index

    def _rows_without_ps(self, unique_ids):
        if not self._loaded:
            return tf.zeros(tf.stack([tf.size(unique_ids), self.output_dim]),
                            self.variable_dtype)
        if self.input_dim is None:
            index = self._row_index.lookup(unique_ids)
            default = tf.shape(self._rows_variable, out_type=tf.int64)[0] - 1
            unique_ids = tf.where(index < 0, default, index)
        rows = tf.gather(self._rows_variable, unique_ids)
        rows.set_shape([None, self.output_dim])
        return rows

    def compute_mask(self, inputs, mask=None):
        if not self.mask_zero or self.combiner is not None:
            return None
        if isinstance(inputs, keras.KerasTensor):  # building a functional model
            return keras.ops.not_equal(inputs, "" if inputs.dtype == "string" else 0)
        return tf.not_equal(inputs, padding(inputs.dtype))

    def compute_output_shape(self, input_shape):
        input_shape = tuple(input_shape)
        if self.combiner is None:
            return input_shape + (self.output_dim,)
        return input_shape[:max(len(input_shape) - 1, 1)] + (self.output_dim,)

    def compute_output_spec(self, inputs):
        ragged = getattr(inputs, "ragged", False)
        sparse = getattr(inputs, "sparse", False)
        if self.combiner is None and (ragged or sparse):
            raise self._needs_combiner_error("ragged" if ragged else "sparse")
        shape = self.compute_output_shape(inputs.shape)
        return keras.KerasTensor(shape, dtype=self.compute_dtype,
                                 ragged=bool(ragged and len(shape) > 2))

    def _needs_combiner_error(self, kind):
        return ValueError(
            f"Embedding {self.name!r} got {kind} ids but has no combiner; ragged and sparse "
            f"ids need combiner in {COMBINERS}. Received: combiner=None"
        )

    # -- export -----------------------------------------------------------------------------

    def load_table(self, ids, rows, default_row=None):
        """Turns the layer into plain TensorFlow serving the given rows.

        Afterwards the layer no longer needs a `LookupContext` nor this package at serving
        time: `model.export(path)` writes a SavedModel that `tf.saved_model.load` serves.

        - Bounded `input_dim`: the rows go into a regular non-trainable
          `[input_dim, output_dim]` weight named "embeddings"; ids not given get
          `default_row`.
        - Unbounded: the rows go into a `[len(ids) + 1, output_dim]` weight named "rows",
          whose last row is `default_row`, and a `tf.lookup.experimental.MutableHashTable`
          maps each given id to its row; any other id gets `default_row`. The table is
          saved with the SavedModel's variables, not as constants in its graph, so the graph
          does not grow with the table; unlike `DenseHashTable` it reserves no key, so every
          int64 id works. `model.export` finds the table through the layer's attributes.

        `default_row` defaults to zeros: an id never trained adds nothing to a "sum", and the
        layer's output for it does not depend on an initializer's random draw.

        Call it once, after the model is built and after reading the model's other weights
        (it adds weights to the layer).

        Args:
            ids: 1-D distinct int64 ids, in `[0, input_dim)` when bounded.
            rows: `[len(ids), output_dim]` rows, in `ids` order.
            default_row: optional `[output_dim]` row for ids not given.

        Raises:
            ValueError: the arguments break these rules, or the table is already loaded.
        """
        if self._loaded:
            raise ValueError(f"Embedding {self.name!r} already has its table loaded.")
        dtype = np.dtype(self.variable_dtype)
        ids, rows, default_row = check_table_rows(
            f"Embedding {self.name!r}", ids, rows, default_row,
            self.output_dim, self.input_dim, dtype)
        self._tracker.unlock()
        try:
            if self.input_dim is not None:
                full = np.tile(default_row, (self.input_dim, 1))
                full[ids] = rows
                self._rows_variable = self.add_weight(
                    name="embeddings", shape=full.shape, dtype=self.variable_dtype,
                    initializer="zeros", trainable=False)
                self._rows_variable.assign(full)
            else:
                self._rows_variable = self.add_weight(
                    name="rows", shape=(ids.size + 1, self.output_dim),
                    dtype=self.variable_dtype, initializer="zeros", trainable=False)
                self._rows_variable.assign(np.concatenate([rows, default_row[None]]))
                self._row_index = tf.lookup.experimental.MutableHashTable(
                    tf.int64, tf.int64, default_value=-1, name=f"{self.name}_row_index")
                self._row_index.insert(tf.constant(ids), tf.range(ids.size, dtype=tf.int64))
        finally:
            self._tracker.lock()
        self._loaded = True

    # -- serialization ----------------------------------------------------------------------

    def get_config(self):
        config = super().get_config()
        config.update({
            "output_dim": self.output_dim,
            "input_dim": self.input_dim,
            "embeddings_initializer": self.initializer_config,
            "combiner": self.combiner,
            "mask_zero": self.mask_zero,
            "embeddings_regularizer": keras.regularizers.serialize(self.embeddings_regularizer),
            "table": self.table,
            **self.lifecycle,
        })
        return config


def _check_positive_int(name, value):
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")


def _check_lifecycle(**settings):
    """The lifecycle arguments as a dict of plain numbers, each checked (None: the job's)."""
    check_lifecycle(settings, lambda name: f"`{name}`")
    return {name: None if value is None else
            (float(value) if name in ("admit_probability", "idle_seconds") else int(value))
            for name, value in settings.items()}
