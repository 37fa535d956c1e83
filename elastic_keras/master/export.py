"""Exports the trained model from the parameter servers as a Keras serving export."""

import logging

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import PSError
from elastic_keras.common.model_spec import Mode
from elastic_keras.common.model_variables import named_variables
from elastic_keras.data.reader import open_reader

logger = logging.getLogger(__name__)


def sample_features(spec, shard_path, index_cache_dir="", num_records=2):
    """Features of a couple of training records, to build the model's variables."""
    reader = open_reader(shard_path, index_cache_dir)
    records = list(reader.read(0, min(num_records, reader.num_records)))
    dataset = spec.dataset_fn(
        tf.data.Dataset.from_tensor_slices(tf.constant(records, dtype=tf.string)),
        Mode.TRAINING, reader.metadata,
    )
    element = next(iter(dataset.batch(len(records))))
    return element[0] if isinstance(element, tuple) else element


def export_saved_model(spec, ps_client, features, path):
    """Builds the model, loads the PS's values into it and writes `model.export(path)`.

    Raises:
        PSError: the PS's variables do not match the model's.
    """
    keras.utils.clear_session()  # the same auto-generated names as in a fresh worker
    model = spec.custom_model()
    model(features, training=False)
    initialized, _, values = ps_client.pull_dense()
    variables = named_variables(model)
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
    model.export(path, verbose=False)
    logger.info("Exported the trained model to %s", path)
    return model
