"""Keras layers whose embedding tables live on the parameter servers.

`Embedding` is what a model imports (`from elastic_keras.layers import Embedding`). The rest
is for the worker and the exporter: `LookupContext` and `lookup_context` serve rows to the
layers during a step, `merge_row_gradients` turns their row gradients into per-table
updates, `ps_tables` lists a model's PS-backed tables (rewiring large plain
`keras.layers.Embedding`s) and `load_table_rows` turns a table back into plain TensorFlow
for export. This package stands on TensorFlow and Keras alone; it knows nothing of gRPC.
"""

from elastic_keras.layers.embedding import Embedding
from elastic_keras.layers.lookup_context import (
    LookupContext,
    LookupRecord,
    current_context,
    lookup_context,
    merge_row_gradients,
)
from elastic_keras.layers.tables import (
    DEFAULT_THRESHOLD_PARAMS,
    TableSpec,
    is_rewired,
    load_table_rows,
    ps_tables,
)

__all__ = [
    "DEFAULT_THRESHOLD_PARAMS",
    "Embedding",
    "LookupContext",
    "LookupRecord",
    "TableSpec",
    "current_context",
    "is_rewired",
    "load_table_rows",
    "lookup_context",
    "merge_row_gradients",
    "ps_tables",
]
