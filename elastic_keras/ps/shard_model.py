"""A shard's model: its dense variables, embedding tables and optimizers, built and restored.

`build_model` checks what InitModel sends (initial values, the optimizer's config, the
embedding tables' configs and the variables' options) and builds a `ShardModel` from it:
a `tf.Variable` per dense value, the Keras optimizer rebuilt from the worker's config behind
an `OptimizerApplier`, an empty `EmbeddingTable` per table and the optimizer's sparse
counterpart for their rows. `ShardModel.prepare` checks a push against the model and
`ShardModel.apply` makes one optimizer step on it. `restore_model` builds the same model
from a `Snapshot` and sets its values, optimizer state and rows; `take_snapshot` copies a
model back into one. Nothing here takes a lock: `Parameters` serialises the calls that
change a model.

Example:

    >>> import json, keras, numpy as np
    >>> sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
    >>> model = build_model([("w", np.array([1.0, 2.0], "float32"))], sgd)
    >>> sorted(model.variables), model.specs["w"].trainable
    (['w'], True)
"""

import dataclasses
import json

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.embedding_init import check_initializer
from elastic_keras.common.errors import CheckpointError, DataError, ModelSpecError, PayloadError
from elastic_keras.common.optimizer_contract import shard_config
from elastic_keras.ps.embedding_table import EmbeddingTable, TableState
from elastic_keras.ps.optimizer import OptimizerApplier, optimizer_from_config
from elastic_keras.ps.shard_types import Snapshot
from elastic_keras.ps.sparse_optimizers import from_keras_config as sparse_optimizer_from_config
from elastic_keras.ps.table_lifecycle import (
    IdleClock, ShardLifecycle, TableCounters, upkeep,
)
from elastic_keras.ps.updates import (
    VariableSpec, check_initial_values, check_table_rows, prepare_update,
)


@dataclasses.dataclass(frozen=True)
class ShardModel:
    """What InitModel creates; fixed once published (only the values change).

    Attributes:
        variables: `{name: tf.Variable}`, the dense variables.
        specs: `{name: VariableSpec}` of the dense variables, which pushes are checked against.
        applier: the `OptimizerApplier` of the trainable dense variables.
        tables: `{name: EmbeddingTable}`, the rows of each table this shard holds.
        sparse_optimizer: the tables' `SparseOptimizer` (None without tables).
        optimizer_config: the shard's optimizer config (`optimizer_contract.shard_config`).
        table_configs: the `TableConfig`s the tables were built from.
        variable_options: `{name: VariableOptions}` of the dense variables.
        idle_clocks: `{table name: IdleClock}` of the tables with `idle_seconds`.
    """

    variables: dict
    specs: dict
    applier: OptimizerApplier
    tables: dict
    sparse_optimizer: object
    optimizer_config: str
    table_configs: tuple
    variable_options: dict
    idle_clocks: dict = dataclasses.field(default_factory=dict)

    def table(self, name, what):
        """The `EmbeddingTable` called `name`, for the request `what`.

        Raises:
            PayloadError: this shard holds no table of that name.
        """
        table = self.tables.get(name)
        if table is None:
            raise PayloadError(
                f"{what}: this shard holds no embedding table {name!r}; it holds "
                f"{sorted(self.tables) or 'none'}. Received: table={name!r}"
            )
        return table

    def lookups(self, ids_by_table, what):
        """`[(EmbeddingTable, ids)]` of `(table name, ids)` pairs, for the request `what`.

        Raises:
            PayloadError: an unknown table, or ids that are not a 1-D integer tensor.
        """
        lookups = [(self.table(name, what), np.asarray(ids)) for name, ids in ids_by_table]
        for table, ids in lookups:
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise PayloadError(
                    f"{what} {table.name!r}: ids must be a 1-D integer tensor. "
                    f"Received: dtype={ids.dtype.name}, shape={list(ids.shape)}"
                )
        return lookups

    def prepare(self, gradients, deltas):
        """A push's gradients and deltas, checked and cast before anything changes.

        Args:
            gradients: `(name, value)` pairs: dense gradients (arrays or `Slices` of a
                variable's rows) and the rows of embedding tables (`Slices`).
            deltas: `(name, array)` pairs of changes to non-trainable variables.

        Returns:
            `(PreparedUpdate, {table name: (ids, grads)})`.

        Raises:
            PayloadError: see `updates.prepare_update` and `updates.check_table_rows`.
        """
        dense = tuple((n, g) for n, g in gradients if n not in self.tables)
        rows = {}
        for name, value in gradients:
            if name in rows:
                raise PayloadError(f"Gradient of table {name!r}: each name may appear once. "
                                   f"Received: {name!r} twice")
            if name in self.tables:
                rows[name] = check_table_rows(self.tables[name], value)
        return prepare_update(self.specs, dense, deltas), rows

    def table_stats(self):
        """`{table name: {"rows", "bytes", and its `TableCounters`}}`."""
        return {name: {"rows": t.num_rows, "bytes": t.nbytes, **t.counters.as_dict()}
                for name, t in self.tables.items()}

    def keep_in_bounds(self, step, max_rows_per_shard=0):
        """`table_lifecycle.upkeep` of the tables after the update `step` (None: a pull)."""
        return upkeep(self.tables, self.idle_clocks, step, max_rows_per_shard)

    def apply(self, gradients, rows, deltas, step, lr_scale=1.0):
        """One optimizer step on the dense variables and table rows, the non-trainable
        variables' deltas added.

        Args:
            gradients: the prepared dense gradients (`PreparedUpdate.gradients`).
            rows: `{table name: (ids, grads)}`.
            deltas: `{name: array}` to add to non-trainable variables.
            step: the tables' optimizer step: the updates applied before this one, plus one.
            lr_scale: a factor on this update's learning rate (staleness modulation).
        """
        self.applier.apply(gradients, lr_scale)
        for name, (ids, grads) in rows.items():
            self.tables[name].apply(ids, grads, self.sparse_optimizer, step, lr_scale)
        for table in self.tables.values():  # every table keeps the shard's step, for recency
            table.advance(step)
        for name, delta in deltas.items():
            variable = self.variables[name]
            variable.assign(variable.numpy() + delta)


def build_model(dense, optimizer_config, tables=(), options=(), lifecycle=ShardLifecycle()):
    """The `ShardModel` of an InitModel request, every part checked first.

    Args:
        dense: `(name, array)` pairs, the shard's variables and their initial values.
        optimizer_config: the JSON of `keras.optimizers.serialize(optimizer)`; the options
            workers apply themselves are dropped (see `optimizer_contract`).
        tables: `TableConfig`s of the model's embedding tables.
        options: `VariableOptions` of the dense variables; a variable without one is
            trainable if it is floating point, unconstrained and decayed.
        lifecycle: the shard's `ShardLifecycle`, which gives each table its own.

    Raises:
        PayloadError: a bad tensor list, optimizer config, table config or option.
    """
    values = check_initial_values(dense)
    checked_options = _check_options(options, values)
    tables = _check_tables(tables, values, lifecycle)
    return _new_model(values, optimizer_config, tables, checked_options, lifecycle)


def warmed(model):
    """`model`, its dense update being traced ahead of the first push (see
    `OptimizerApplier.start_warm_up`): for a model a shard takes to train with."""
    model.applier.start_warm_up()
    return model


def restore_model(snapshot, lifecycle=ShardLifecycle()):
    """The `ShardModel` of a `Snapshot`: built as `build_model` builds it from the snapshot's
    optimizer config and tables, then its values, optimizer state and table rows set.

    Raises:
        CheckpointError: the snapshot is inconsistent (a missing slot, a table's rows that
            do not fit its config, ...).
    """
    try:
        model = build_model(tuple(snapshot.dense.items()), snapshot.optimizer_config,
                            snapshot.tables, snapshot.variable_options.values(), lifecycle)
        model.applier.set_state(snapshot.optimizer_iterations, snapshot.optimizer_slots,
                                snapshot.optimizer_others)
        steps = snapshot.version if snapshot.table_steps is None else snapshot.table_steps
        _restore_tables(model, snapshot.table_states, steps)
        for name, counts in snapshot.table_counters.items():
            if name in model.tables:
                model.tables[name].counters = TableCounters(**counts)
        for name, sketch in snapshot.table_sketches.items():  # another budget: counted anew
            if name in model.tables and model.tables[name].admission is not None:
                model.tables[name].admission.restore(sketch)
    except (PayloadError, DataError, TypeError, ValueError) as exc:
        raise CheckpointError(f"The snapshot at version {snapshot.version} cannot be "
                              f"restored: {exc}") from exc
    return model


def take_snapshot(model, version, applied_sequences, applied_pushes, table_steps):
    """A `Snapshot` of `model`'s values, optimizer state and rows, with the shard's counters.

    Args:
        version: the shard's model version.
        applied_sequences: `{worker id: the highest push sequence applied}`.
        applied_pushes: `{worker id: pushes whose updates the shard holds}`.
        table_steps: the updates the shard has applied (the tables' optimizer step).
    """
    iterations, slots, others = model.applier.state()
    return Snapshot(
        version=version,
        optimizer_config=model.optimizer_config,
        tables=model.table_configs,
        dense={name: v.numpy() for name, v in model.variables.items()},
        optimizer_iterations=iterations,
        optimizer_slots=slots,
        optimizer_others=others,
        table_states={name: t.state() for name, t in model.tables.items()},
        applied_sequences=dict(applied_sequences),
        variable_options=dict(model.variable_options),
        applied_pushes=dict(applied_pushes),
        table_steps=table_steps,
        table_counters={name: t.counters.as_dict() for name, t in model.tables.items()},
        table_sketches={name: sketch for name, t in model.tables.items()
                        if t.admission and (sketch := t.admission.state()) is not None},
    )


def _new_model(values, optimizer_config, tables, options, lifecycle=ShardLifecycle()):
    """The `ShardModel` of checked initial values, optimizer config, tables and options.

    Raises:
        PayloadError: an optimizer config Keras cannot rebuild or the tables do not support.
    """
    optimizer_config = shard_config(optimizer_config)
    optimizer = optimizer_from_config(optimizer_config)
    sparse_optimizer = sparse_optimizer_from_config(optimizer_config) if tables else None
    variables = {
        name: tf.Variable(value, name=name, constraint=_constraint(options.get(name)))
        for name, value in values.items()
    }
    specs = {name: VariableSpec.of(v, options[name].trainable if name in options else None)
             for name, v in variables.items()}
    slot_names = sparse_optimizer.slot_names if sparse_optimizer else ()
    return ShardModel(
        variables=variables,
        specs=specs,
        applier=OptimizerApplier(
            optimizer, {n: v for n, v in variables.items() if specs[n].trainable},
            [n for n, o in options.items() if o.exclude_from_weight_decay and specs[n].trainable],
        ),
        tables={
            t.name: EmbeddingTable(
                t.name, t.dim, t.initializer, t.input_dim, np.dtype(t.dtype),
                slot_names=slot_names,
                slot_initial_values={n: sparse_optimizer.slot_initial_value(n)
                                     for n in slot_names},
                lifecycle=lifecycle.of_table(t),
            )
            for t in tables
        },
        sparse_optimizer=sparse_optimizer,
        optimizer_config=optimizer_config,
        table_configs=tuple(tables),
        variable_options=options,
        idle_clocks={t.name: IdleClock(seconds) for t in tables
                     if (seconds := lifecycle.of_table(t).idle_seconds)},
    )


def with_options(model, options):
    """`model` rebuilt with the variables' `options` (which are trainable, constrained,
    decayed), keeping values, tables and the optimizer's state of the trainable variables.

    Args:
        options: `{name: VariableOptions}`, checked against the variables (the
            `variable_options` of a model `build_model` made from the same values).

    Raises:
        PayloadError: the optimizer's state does not fit the rebuilt optimizer.
    """
    values = {name: variable.numpy() for name, variable in model.variables.items()}
    rebuilt = _new_model(values, model.optimizer_config, (), options)
    iterations, slots, others = model.applier.state()
    try:
        rebuilt.applier.set_state(
            iterations, {n: s for n, s in slots.items() if rebuilt.specs[n].trainable}, others)
    except ValueError as exc:
        raise PayloadError(f"InitModel: the restored optimizer state does not fit the "
                           f"variables' options: {exc}") from exc
    return dataclasses.replace(rebuilt, tables=model.tables,
                               sparse_optimizer=model.sparse_optimizer,
                               table_configs=model.table_configs,
                               idle_clocks=model.idle_clocks)


def _constraint(options):
    """The Keras constraint a variable's `VariableOptions` name, or None."""
    if options is None or not options.constraint:
        return None
    return keras.constraints.deserialize(json.loads(options.constraint))


def _check_options(options, values):
    """`{name: VariableOptions}` of `options`, checked against the dense variables."""
    checked = {}
    for option in options:
        what = f"Variable options {option.name!r}"
        if option.name not in values or option.name in checked:
            raise PayloadError(f"{what}: must name each dense variable at most once. "
                               f"Received: name={option.name!r}")
        if option.constraint:
            try:
                constraint = keras.constraints.deserialize(json.loads(option.constraint))
            except Exception as exc:  # Keras raises ValueError, TypeError, ...
                raise PayloadError(
                    f"{what}: the constraint must be the JSON of a built-in Keras constraint "
                    f"({type(exc).__name__}: {exc}). Received: {option.constraint[:200]!r}"
                ) from exc
            if not callable(constraint):
                raise PayloadError(f"{what}: the constraint must be a Keras constraint. "
                                   f"Received: {option.constraint[:200]!r}")
        checked[option.name] = option
    return checked


def _restore_tables(model, states, step):
    """Replaces the empty tables of a new `model` with tables holding `states`' rows, at
    the update `step`."""
    sparse_optimizer = model.sparse_optimizer
    if set(states) != set(model.tables):
        raise CheckpointError(f"The table states must be those of the tables "
                              f"{sorted(model.tables)}. Received: {sorted(states)}")
    for name, empty in list(model.tables.items()):
        state = TableState(*states[name])
        if set(state.slots) != set(empty.slot_names):
            raise CheckpointError(f"Table {name!r} needs the optimizer slots "
                                  f"{list(empty.slot_names)}. Received: {sorted(state.slots)}")
        if state.values.shape[1:] != (empty.dim,) or state.values.dtype != empty.dtype:
            raise CheckpointError(
                f"Table {name!r} rows must be {empty.dtype.name} of width {empty.dim}. "
                f"Received: {state.values.dtype.name}, shape {list(state.values.shape)}"
            )
        model.tables[name] = EmbeddingTable.from_state(
            name, empty.initializer, state.ids, state.values,
            {slot: state.slots[slot] for slot in empty.slot_names}, empty.input_dim,
            {n: sparse_optimizer.slot_initial_value(n) for n in empty.slot_names},
            state.touched, step, empty.lifecycle,
        )


def _check_tables(tables, dense_values, lifecycle):
    """The `TableConfig`s of `tables` as a list, each checked (its lifecycle on this shard
    too); names unique and unlike the dense variables'."""
    checked = []
    for table in tables:
        what = f"Embedding table {table.name!r}"
        if not table.name or table.name in dense_values:
            raise PayloadError(f"{what}: needs a name unlike any dense variable's. "
                               f"Received: name={table.name!r}")
        if table.dim < 1 or table.input_dim < 0:
            raise PayloadError(f"{what}: dim must be >= 1 and input_dim >= 0. "
                               f"Received: dim={table.dim}, input_dim={table.input_dim}")
        try:
            floating = np.dtype(table.dtype or "float32").kind == "f"
        except TypeError:  # not a dtype numpy knows
            floating = False
        if not floating:
            raise PayloadError(f"{what}: rows must be floating point (a dtype such as "
                               f"'float32'). Received: dtype={table.dtype!r}")
        try:
            check_initializer(table.initializer or "uniform", table.input_dim)
        except ModelSpecError as exc:
            raise PayloadError(f"{what}: {exc}") from exc
        try:
            lifecycle.of_table(table)
        except (TypeError, ValueError) as exc:
            raise PayloadError(f"{what}: its admission or eviction: {exc}") from exc
        checked.append(table)
    names = [t.name for t in checked]
    if len(set(names)) != len(names):
        raise PayloadError(f"Embedding table names must be unique. Received: {names}")
    return checked
