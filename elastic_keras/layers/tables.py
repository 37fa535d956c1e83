"""Which embedding tables of a model the parameter servers serve, and how they return.

`ps_tables(model)` finds every PS-backed layer of a built model and describes each table it
uses as a `TableSpec`:

- every `elastic_keras.layers.Embedding`;
- every plain `keras.layers.Embedding` whose `input_dim * output_dim` exceeds
  `threshold_params`. Such a layer is rewired in place: inside a `LookupContext` its call
  looks its ids up through the context, like `Embedding` does; outside one it keeps calling
  its own `embeddings` variable. That variable is no longer a dense parameter (the
  `TableSpec` lists it in `replaced_variables`): the worker neither pulls nor pushes it.
  Smaller plain Embeddings stay dense variables, whose `IndexedSlices` gradients the
  parameter servers apply sparsely.

`load_table_rows(spec, ids, rows)` is the way back, for export: it makes every layer of the
table serve the given rows as plain TensorFlow (`Embedding.load_table`; a rewired plain
Embedding gets the rows written into its `embeddings` variable and its own call back).

Example:

    >>> specs = ps_tables(model, threshold_params=1_000_000)  # doctest: +SKIP
    >>> [(s.name, s.dim, s.input_dim) for s in specs]  # doctest: +SKIP
    [('user', 16, 0), ('embedding', 8, 5000000)]
"""

import dataclasses
import types

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.config import EMBEDDING_THRESHOLD_PARAMS
from elastic_keras.common.errors import ModelSpecError
from elastic_keras.layers.embedding import Embedding
from elastic_keras.layers.id_tensors import check_id_range, check_table_rows, gather_rows
from elastic_keras.layers.lookup_context import current_context, lookup_unique

DEFAULT_THRESHOLD_PARAMS = EMBEDDING_THRESHOLD_PARAMS  # what a job uses by default


@dataclasses.dataclass(frozen=True)
class TableSpec:
    """One parameter-server embedding table and the layers that use it.

    Attributes:
        name: the table's name (an `Embedding`'s `table`; a plain Embedding's layer name).
        dim: the width of each row.
        input_dim: the id bound, or 0 for an unbounded id space.
        initializer_config: `keras.initializers.serialize` of the rows' initializer.
        dtype: the rows' dtype, e.g. "float32".
        layers: the layers that look rows up in this table, in model order.
        lifecycle: those of `"admit_after"`, `"admit_probability"`, `"idle_steps"`,
            `"max_rows"` and `"idle_seconds"` the layers set (the others: the job's flags;
            plain Embeddings set none).
        replaced_variables: the rewired plain Embeddings' `embeddings` variables: not dense
            parameters any more; the worker must leave them out of dense pull and push.
    """

    name: str
    dim: int
    input_dim: int
    initializer_config: dict = dataclasses.field(hash=False)
    dtype: str
    layers: tuple = dataclasses.field(hash=False)
    replaced_variables: tuple = dataclasses.field(hash=False)
    lifecycle: dict = dataclasses.field(hash=False, default_factory=dict)


def ps_tables(model, threshold_params=DEFAULT_THRESHOLD_PARAMS):
    """The tables of the built `model` that the parameter servers serve, in model order.

    Rewires every plain `keras.layers.Embedding` with more than `threshold_params`
    parameters (see the module's docstring); calling it again rewires nothing new.

    Args:
        model: a built Keras model (functional, Sequential or subclassed).
        threshold_params: a non-negative int.

    Raises:
        ValueError: `threshold_params` is not a non-negative int, a plain Embedding is not
            built, or layers sharing a table disagree on its dim, input_dim, initializer or
            dtype.
    """
    if (not isinstance(threshold_params, (int, np.integer)) or isinstance(threshold_params, bool)
            or threshold_params < 0):
        raise ValueError(
            "`threshold_params` must be a non-negative integer. "
            f"Received: threshold_params={threshold_params!r}")
    found = {}  # table name -> (first layer, its description, [layers], [variables])
    # `_flatten_layers` is how Keras itself walks the layers of any kind of model.
    for layer in model._flatten_layers(include_self=False, recursive=True):
        if isinstance(layer, Embedding):
            name, replaced = layer.table, None
        elif isinstance(layer, keras.layers.Embedding) and _is_large(layer, threshold_params):
            name, replaced = _rewire(layer), layer.embeddings
        else:
            continue
        described = _describe(layer)
        if name not in found:
            found[name] = (layer, described, [], [])
        first, first_described, layers, variables = found[name]
        if described != first_described:
            raise ValueError(
                f"Layers sharing the embedding table {name!r} must agree on its output_dim, "
                f"input_dim, initializer, dtype and lifecycle. Received: {first.name!r} has "
                f"{first_described} and {layer.name!r} has {described}")
        layers.append(layer)
        if replaced is not None:
            variables.append(replaced)
    return [
        TableSpec(name, described["dim"], described["input_dim"],
                  described["initializer_config"], described["dtype"],
                  tuple(layers), tuple(variables), described["lifecycle"])
        for name, (_, described, layers, variables) in found.items()
    ]


def load_table_rows(spec, ids, rows, default_row=None):
    """Makes every layer of the table `spec` serve `rows` as plain TensorFlow, for export.

    Ids that are not given are served `default_row` (zeros by default): for a bounded table
    those rows of the weight hold it, for an unbounded one every unseen id gets it. A rewired
    plain Embedding gets the rows written into its `embeddings` variable and its own call
    back, so it exports as the ordinary Keras layer it was.

    Args:
        spec: a `TableSpec` from `ps_tables`.
        ids: 1-D distinct int64 ids.
        rows: `[len(ids), spec.dim]` rows in `ids` order.
        default_row: optional `[spec.dim]` row for the ids not given.

    Raises:
        ValueError: the rows do not fit the table (see `Embedding.load_table`).
    """
    for layer in spec.layers:
        if isinstance(layer, Embedding):
            layer.load_table(ids, rows, default_row)
        else:
            _load_plain(layer, ids, rows, default_row)


def is_rewired(layer):
    """Whether `ps_tables` rewired this plain `keras.layers.Embedding`."""
    return getattr(vars(layer).get("call"), "_ps_backed", False)


def _is_large(layer, threshold_params):
    if not layer.built:
        raise ValueError(
            f"ps_tables needs a built model; keras Embedding {layer.name!r} is not built. "
            "Call the model on a batch first.")
    if getattr(layer, "lora_enabled", False) or getattr(layer, "quantization_mode", None):
        return False  # LoRA and quantized Embeddings keep their own, dense, weights.
    return layer.input_dim * layer.output_dim > threshold_params


def _describe(layer):
    if getattr(layer, "embeddings_constraint", None) is not None:
        raise ModelSpecError(
            f"Embedding {layer.name!r} is served from the parameter servers, which update "
            "its rows one by one and cannot apply a constraint over the whole table; drop "
            "embeddings_constraint or raise --embedding-threshold-params above its "
            f"{layer.input_dim * layer.output_dim} parameters. Received: embeddings_constraint="
            f"{type(layer.embeddings_constraint).__name__}"
        )
    input_dim = layer.input_dim or 0
    return {
        "dim": int(layer.output_dim),
        "input_dim": int(input_dim),
        "initializer_config": keras.initializers.serialize(layer.embeddings_initializer),
        "dtype": str(layer.variable_dtype),
        # What the layer sets of its lifecycle (a plain Embedding sets none).
        "lifecycle": {k: v for k, v in (getattr(layer, "lifecycle", None) or {}).items()
                      if v is not None},
    }


def _rewire(layer):
    """Makes a plain Embedding look its rows up through the current `LookupContext`."""
    if is_rewired(layer):
        return layer.name
    original_call = layer.call
    table = layer.name

    def call(self, inputs):
        ctx = current_context()
        if ctx is None:
            return original_call(inputs)
        ids = check_id_range(tf.cast(inputs, tf.int64), self.input_dim, self.name)
        rows, index = lookup_unique(table, ids, self.output_dim, self.variable_dtype, None)
        if self.embeddings_regularizer is not None:
            self.add_loss(self.embeddings_regularizer(rows))
        return tf.cast(gather_rows(rows, index, ids, self.output_dim), self.compute_dtype)

    bound = types.MethodType(call, layer)
    bound.__func__._ps_backed = True
    layer.call = bound
    # The regularizer now applies to the looked-up rows (in `call`), not to the variable.
    layer.embeddings.regularizer = None
    return table


def _load_plain(layer, ids, rows, default_row):
    dtype = np.dtype(layer.variable_dtype)
    ids, rows, default_row = check_table_rows(
        f"Embedding {layer.name!r}", ids, rows, default_row,
        layer.output_dim, layer.input_dim, dtype)
    full = np.tile(default_row, (layer.input_dim, 1))
    full[ids] = rows
    layer.embeddings.assign(full)
    if is_rewired(layer):
        del layer.call
        layer.embeddings.regularizer = layer.embeddings_regularizer
