"""Exports the trained model from the parameter servers as a Keras serving export."""

import logging

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import ConfigError, PSError
from elastic_keras.common.model_spec import Mode
from elastic_keras.common.model_variables import named_variables
from elastic_keras.data.reader import open_reader
from elastic_keras.layers.tables import load_table_rows, ps_tables

logger = logging.getLogger(__name__)


_PULL_IDS = 1 << 20  # ids per read-only pull of a bounded table's untrained rows


def sample_features(spec, shard_path, index_cache_dir="", num_records=2):
    """Features of a couple of records of `shard_path`, to build the model's variables and
    shape the SavedModel's inputs; without a file, zeros shaped as the model's declared
    inputs.

    Raises:
        ConfigError: no file, and a model that declares no inputs (a subclassed one).
    """
    if not shard_path:
        return _declared_inputs(spec, num_records)
    reader = open_reader(shard_path, index_cache_dir)
    records = reader.read(0, min(num_records, reader.num_records))
    dataset = spec.minibatches(
        tf.data.Dataset.from_tensor_slices(tf.constant(records, dtype=tf.string)),
        Mode.TRAINING, reader.metadata, len(records),
    )
    element = next(iter(dataset))
    return element[0] if isinstance(element, tuple) else element


def _declared_inputs(spec, num_records):
    keras.utils.clear_session()
    model = spec.custom_model()
    try:
        declared = model.input
    except (AttributeError, ValueError):
        raise ConfigError(
            f"Model module '{spec.module_name}': its model declares no inputs (a subclassed "
            "model), so the SavedModel's input signature must come from data: give "
            "--prediction-data, --validation-data or --training-data. Received: none") from None

    def zeros(tensor):
        shape = [num_records] + [d or 1 for d in tensor.shape[1:]]
        if tensor.dtype == "string":
            return tf.fill(shape, "")
        return tf.zeros(shape, tensor.dtype)

    return tf.nest.map_structure(zeros, declared)


def export_saved_model(spec, ps_client, features, path, embedding_threshold_params):
    """Writes `model.export(path)` of `trained_model(...)`; returns the model.

    Raises:
        PSError: the PS's variables do not match the model's.
    """
    model = trained_model(spec, ps_client, features, embedding_threshold_params)
    model.export(path, verbose=False)
    logger.info("Exported the trained model to %s", path)
    return model


def trained_model(spec, ps_client, features, embedding_threshold_params):
    """The module's model built on `features`, holding the parameter servers' values.

    Embedding tables become plain TensorFlow: a bounded table an ordinary weight (ids without
    a row get what the shards serve evaluation for them: their initial rows, or zeros where
    the table admits ids), an unbounded one a hash-table lookup
    of the trained rows with a zero row for unseen ids.

    Raises:
        PSError: the PS's variables do not match the model's.
    """
    keras.utils.clear_session()  # the same auto-generated names as in a fresh worker
    model = spec.custom_model()
    model(features, training=False)
    tables = ps_tables(model, embedding_threshold_params)
    replaced = {id(v) for table in tables for v in table.replaced_variables}
    # With use_ema, the moving averages: what Keras's fit leaves in the model at its end.
    initialized, _, values = ps_client.pull_dense(full_precision=True, averaged=True)
    variables = {n: v for n, v in named_variables(model).items() if id(v) not in replaced}
    missing = sorted(set(variables) - set(values))
    if not initialized or missing:
        raise PSError(
            "The parameter servers do not hold every variable of the model; cannot export. "
            f"Received: missing={missing[:5]}{'...' if len(missing) > 5 else ''}"
        )
    for name, variable in variables.items():
        value = values[name]
        if tuple(value.shape) != tuple(variable.shape):
            raise PSError(
                f"Variable {name!r} has shape {tuple(variable.shape)} in the model but the "
                f"parameter servers hold shape {tuple(value.shape)}."
            )
        variable.assign(np.asarray(value, dtype=variable.dtype))
    for table in tables:
        ids, rows, trained = _table_rows(ps_client, table)
        load_table_rows(table, ids, rows)
        logger.info("Table %s: %d rows taken, %d of them looked up in training",
                    table.name, len(ids), trained)
    return model


def _table_rows(ps_client, table):
    """Every row the shards hold; for a bounded table, also the rows of the other ids as
    the shards serve them to evaluation (their initial rows, or zeros where the table
    admits ids)."""
    ids, rows = ps_client.pull_table(table.name)
    if rows is None:
        rows = np.zeros((0, table.dim), table.dtype)
    trained = len(ids)
    if table.input_dim:
        missing = np.setdiff1d(np.arange(table.input_dim, dtype=np.int64), ids)
        fresh = [ps_client.pull_embeddings({table.name: part}, read_only=True,
                                           full_precision=True)[table.name]
                 for part in np.array_split(missing, max(1, -(-len(missing) // _PULL_IDS)))]
        ids = np.concatenate([ids, missing])
        rows = np.concatenate([rows, *(f.reshape(-1, table.dim) for f in fresh)])
    return ids, rows, trained
