"""One shard's parameters: initialisation, pulls and asynchronous gradient pushes.

`Parameters` is the parameter server's domain object; it knows nothing of gRPC. It holds
the dense variables InitModel gave it as `tf.Variable`s, the Keras optimizer rebuilt from
the worker's config, the model version, and the highest sequence number applied per
worker. Pushes are asynchronous: each one is applied at once and bumps the version by one.
A push is checked completely before anything changes, and applied at most once.

Example:

    >>> import json, keras, numpy as np
    >>> params = Parameters()
    >>> sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
    >>> params.init_model([("w", np.array([1.0, 2.0], "float32"))], sgd)
    InitResult(initialized_now=True, model_version=0)
    >>> params.push(Push(worker_id=0, sequence=1, gradients=[("w", np.ones(2, "float32"))]))
    PushResult(accepted=True, model_version=1, reason='')
    >>> params.pull().dense["w"].tolist()
    [0.5, 1.5]

`snapshot()` copies the whole state as plain data (for checkpoints, see `ps/checkpoint.py`)
and `restore()` starts an empty shard from one.
"""

import collections
import dataclasses
import json
import secrets
import threading
import time

import keras
import numpy as np
import tensorflow as tf

from elastic_keras.common.embedding_init import check_initializer
from elastic_keras.common.errors import (
    CheckpointError, DataError, ModelSpecError, NotReadyError, PayloadError, PSError,
)
from elastic_keras.common.optimizer_contract import shard_config
from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps.consistency import StalenessStats, SyncRound, UpdatePolicy
from elastic_keras.ps.embedding_table import EmbeddingTable, TableState
from elastic_keras.ps.optimizer import OptimizerApplier, optimizer_from_config
from elastic_keras.ps.sparse_optimizers import from_keras_config as sparse_optimizer_from_config
from elastic_keras.ps.updates import VariableSpec, check_initial_values, prepare_update

DUPLICATE = "duplicate"
STALE = "stale"
HELD = "held"


@dataclasses.dataclass(frozen=True)
class Push:
    """Gradients from one worker step.

    `gradients` holds `(name, value)` pairs, each value a numpy array (dense) or a
    `tensor_codec.Slices` (rows); `deltas` holds `(name, array)` pairs: what the step added
    to non-trainable variables. `(worker_id, sequence)` names the minibatch: a shard applies
    a sequence at most once, so a resent push is a no-op where it was applied.
    """

    worker_id: int
    sequence: int
    model_version: int = 0
    gradients: tuple = ()
    deltas: tuple = ()
    incarnation: int = 0  # of the shard the gradients were computed against; 0: not known


@dataclasses.dataclass(frozen=True)
class PushResult:
    """`reason` is `DUPLICATE` for a push already applied, explains a rejection, else empty.

    `stale` marks a push rejected for the version it was computed against: pull and retry.
    `held` marks one held back while the shard takes a checkpoint: send it again.
    """

    accepted: bool
    model_version: int
    reason: str = ""
    stale: bool = False
    held: bool = False


@dataclasses.dataclass(frozen=True)
class InitResult:
    """`initialized_now` is False when the shard already held a model and kept it."""

    initialized_now: bool
    model_version: int


@dataclasses.dataclass(frozen=True)
class PullResult:
    """`dense` maps names to arrays; empty before init and when the caller's version is current.

    `incarnation` names this run of the shard (see `Parameters.incarnation`)."""

    initialized: bool
    model_version: int
    dense: dict
    incarnation: int = 0


@dataclasses.dataclass(frozen=True)
class TableConfig:
    """An embedding table this shard holds part of (rows whose ids hash to it)."""

    name: str
    dim: int
    input_dim: int = 0
    initializer: str = "uniform"
    dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class VariableOptions:
    """How the optimizer treats one dense variable (see `pserver.proto`)."""

    name: str
    trainable: bool = True
    constraint: str = ""
    exclude_from_weight_decay: bool = False


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """A shard's whole state as plain data: what `Parameters.snapshot` copies and `restore` takes.

    Attributes:
        version: the model version.
        optimizer_config: the JSON of `keras.optimizers.serialize(optimizer)`.
        tables: the `TableConfig`s the shard was initialised with.
        dense: `{name: array}` of the dense variables, in their own dtypes.
        optimizer_iterations: the dense optimizer's step count.
        optimizer_slots: `{variable name: {slot name: array}}` (see `OptimizerApplier.state`).
        optimizer_others: `{key: array}`: the dense optimizer's other variables.
        table_states: `{table name: TableState}`, rows with their optimizer slots.
        applied_sequences: `{worker id: the highest push sequence applied}`.
        variable_options: `{name: VariableOptions}` of the dense variables.
        applied_pushes: `{worker id: pushes whose updates the shard holds}`.
        table_steps: the updates the shard has applied: the step count of the tables'
            sparse optimizer, which keeps no other state (None: the version, as files
            written before versions could jump on a relaunch).
    """

    version: int
    optimizer_config: str
    tables: tuple
    dense: dict
    optimizer_iterations: int
    optimizer_slots: dict
    optimizer_others: dict
    table_states: dict
    applied_sequences: dict
    variable_options: dict = dataclasses.field(default_factory=dict)
    applied_pushes: dict = dataclasses.field(default_factory=dict)
    table_steps: int = None


@dataclasses.dataclass(frozen=True)
class _Model:
    """What InitModel creates; fixed once published (only the values change)."""

    variables: dict
    specs: dict
    applier: OptimizerApplier
    tables: dict
    sparse_optimizer: object
    optimizer_config: str
    table_configs: tuple
    variable_options: dict


@dataclasses.dataclass
class _Hold:
    """A checkpoint being taken: pushes are held until `until`, except those the cut holds."""

    checkpoint_id: int
    until: float
    cut: dict = None  # worker id -> the highest sequence of the checkpoint, once known
    held: dict = dataclasses.field(default_factory=dict)  # worker id -> highest held

    def holds(self, worker_id, sequence):
        """Whether a push is held back (and notes it: the worker has moved on to it)."""
        if self.cut is not None and sequence <= self.cut.get(worker_id, -1):
            return False
        self.held[worker_id] = max(sequence, self.held.get(worker_id, sequence))
        return True

    def reached(self, applied):
        """Whether every worker of the cut has had its minibatches up to the cut applied by
        this shard, or has moved on past them (sequences settle in order: what it skipped
        was dropped here and will not come)."""
        return all(applied.get(w, -1) >= s or self.held.get(w, -1) > s
                   for w, s in self.cut.items())


class Parameters:
    """The dense variables, optimizer and model version of one parameter-server shard.

    Thread-safe: checking and casting a push happen outside the lock; applying it, pulls'
    snapshots and initialisation happen under it.

    `incarnation` is a random number fixed for this object's life: a shard process that
    restarts (restored from a checkpoint, or initialised again) gets another, so a worker's
    values and gradients of an earlier run are never taken for current ones, whatever
    their version numbers.
    """

    def __init__(self, policy=UpdatePolicy(), min_version=0):
        self.policy = policy
        self._min_version = min_version  # where a model starts: a restarted shard goes on
        self.incarnation = secrets.randbits(63) or 1
        self._lock = threading.Lock()
        self._version_changed = threading.Condition(self._lock)  # also: sequences applied
        self._hold = None
        self._options_pending = False  # restored from a file without variable options
        self._model = None
        self._version = min_version
        self._steps = 0  # updates applied: the step of the tables' sparse optimizer
        self._applied_sequence = {}
        self._applied_pushes = collections.Counter()  # worker id -> pushes applied
        self._round = SyncRound()
        self._round_size = policy.grads_to_wait
        self.staleness = StalenessStats()

    @property
    def initialized(self):
        return self._model is not None

    @property
    def version(self):
        return self._version

    def applied_sequence(self, worker_id):
        """The highest push sequence of `worker_id` this shard applied (0: none)."""
        with self._lock:
            return self._applied_sequence.get(worker_id, 0)

    @property
    def applied_pushes(self):
        """`{worker id: pushes whose updates this shard holds}`."""
        with self._lock:
            return dict(self._applied_pushes)

    def init_model(self, dense, optimizer_config, tables=(), options=()):
        """Initialises the shard at version 0, unless it already holds a model.

        Of several concurrent calls exactly one initialises; the others keep its model.

        Args:
            dense: `(name, array)` pairs, the shard's variables and their initial values.
            optimizer_config: the JSON of `keras.optimizers.serialize(optimizer)`; the
                options workers apply themselves are dropped (see `optimizer_contract`).
            tables: `TableConfig`s of the model's embedding tables; their rows are created
                on first lookup and updated by the optimizer's sparse counterpart.
            options: `VariableOptions` of the dense variables; a variable without one is
                trainable if it is floating point, unconstrained and decayed.

        Returns:
            An `InitResult`.

        Raises:
            PayloadError: a bad tensor list or optimizer config (checked on every call, before
                anything changes).
        """
        values = check_initial_values(dense)
        options = _check_options(options, values)
        model = _new_model(values, optimizer_config, _check_tables(tables, values), options)
        with self._lock:
            if self._model is not None:
                if self._options_pending and options:
                    self._model = _with_options(self._model, options)
                    self._options_pending = False
                return InitResult(initialized_now=False, model_version=self._version)
            self._model = model
            self._version = self._min_version
            return InitResult(initialized_now=True, model_version=self._version)

    def snapshot(self):
        """A consistent copy of the whole shard as a `Snapshot` of numpy data.

        Taken under the lock. An open synchronous round is applied first (its pushes
        averaged over their number, as a round timeout would), so the snapshot holds the
        update of every push whose sequence it records as applied.

        Raises:
            NotReadyError: the shard has no model yet.
        """
        model = self._require_model("A snapshot")
        with self._lock:
            return self._snapshot_locked(model)

    def prepare_checkpoint(self, checkpoint_id, hold_s):
        """Holds every push from now on, for up to `hold_s` seconds (see `snapshot_at_cut`).

        Returns:
            `({worker id: the highest sequence applied}, version)`.
        """
        self._require_model("PrepareCheckpoint")
        with self._lock:
            self._hold = _Hold(checkpoint_id, time.monotonic() + hold_s)
            return dict(self._applied_sequence), self._version

    def snapshot_at_cut(self, checkpoint_id, cut):
        """The `snapshot()` of the checkpoint `prepare_checkpoint` began, at the cut.

        Lets through the held pushes the cut holds and waits, until the hold ends, for this
        shard to have applied, of every worker in `cut`, every sequence up to its cut; then
        snapshots and lets every push through again.

        Args:
            cut: `{worker id: the highest sequence the checkpoint holds}`.

        Raises:
            NotReadyError: no model, no hold of this checkpoint (it ended, or another began),
                or the cut was not reached before the hold ended; pushes go through again.
        """
        model = self._require_model("SaveCheckpoint")
        with self._lock:
            hold = self._live_hold()
            if hold is None or hold.checkpoint_id != checkpoint_id:
                raise NotReadyError(
                    f"SaveCheckpoint {checkpoint_id}: this shard holds no pushes for it (its "
                    "hold ended or another checkpoint began). Received: checkpoint_id="
                    f"{checkpoint_id}"
                )
            hold.cut = dict(cut)
            reached = self._version_changed.wait_for(
                lambda: self._hold is not hold or hold.reached(self._applied_sequence),
                max(0.0, hold.until - time.monotonic()))
            if not reached or self._hold is not hold:
                if self._hold is hold:
                    self._hold = None
                missing = {w: s for w, s in cut.items()
                           if self._applied_sequence.get(w, -1) < s}
                raise NotReadyError(
                    f"SaveCheckpoint {checkpoint_id}: the shard did not receive every "
                    "minibatch of the cut before its hold ended; the checkpoint is abandoned. "
                    f"Received: missing sequences {missing}"
                )
            self._hold = None
            self._version_changed.notify_all()
            return self._snapshot_locked(model)

    def release_checkpoint(self, checkpoint_id):
        """Ends the hold of checkpoint `checkpoint_id` (the master gave it up)."""
        with self._lock:
            if self._hold is not None and self._hold.checkpoint_id == checkpoint_id:
                self._hold = None
                self._version_changed.notify_all()

    def held(self, worker_id, sequence):
        """The answer to a push of (`worker_id`, `sequence`) if a checkpoint holds it back,
        else None: a cheap check before the push is decoded."""
        with self._lock:
            hold = self._live_hold()
            if hold is None or not hold.holds(worker_id, sequence):
                return None
            self._version_changed.notify_all()  # a cut may wait for this worker
            return PushResult(accepted=False, model_version=self._version, held=True,
                              reason=f"{HELD}: the shard is taking checkpoint "
                              f"{hold.checkpoint_id}")

    def _live_hold(self):
        if self._hold is not None and time.monotonic() > self._hold.until:
            self._hold = None
        return self._hold

    def _snapshot_locked(self, model):
        if self._round.count:
            self._close_round(model)
        iterations, slots, others = model.applier.state()
        return Snapshot(
                version=self._version,
                optimizer_config=model.optimizer_config,
                tables=model.table_configs,
                dense={name: v.numpy() for name, v in model.variables.items()},
                optimizer_iterations=iterations,
                optimizer_slots=slots,
                optimizer_others=others,
                table_states={name: t.state() for name, t in model.tables.items()},
                applied_sequences=dict(self._applied_sequence),
                variable_options=dict(model.variable_options),
                applied_pushes=dict(self._applied_pushes),
                table_steps=self._steps,
            )

    def restore(self, snapshot):
        """Initialises this empty shard from a `Snapshot`, as InitModel then pushes would.

        The model is built exactly as `init_model` builds it from the snapshot's optimizer
        config and tables; then values, optimizer slots, table rows, the version and the
        applied sequences are set. A later InitModel keeps the restored model. The version
        is at least this object's `min_version` (the highest the shard had reached, as the
        master knows it), so versions never go backwards.

        Raises:
            PSError: the shard already holds a model.
            CheckpointError: the snapshot is inconsistent (a missing slot, a table's rows
                that do not fit its config, ...); the shard stays empty.
        """
        if self._model is not None:
            raise PSError(
                "restore needs an empty shard: this one already holds a model at version "
                f"{self._version}. Received: a snapshot at version {snapshot.version}"
            )
        try:
            values = check_initial_values(tuple(snapshot.dense.items()))
            model = _new_model(values, snapshot.optimizer_config,
                               _check_tables(snapshot.tables, values),
                               _check_options(snapshot.variable_options.values(), values))
            model.applier.set_state(snapshot.optimizer_iterations, snapshot.optimizer_slots,
                                    snapshot.optimizer_others)
            _restore_tables(model, snapshot.table_states, model.sparse_optimizer)
        except (PayloadError, DataError, ValueError) as exc:
            raise CheckpointError(f"The snapshot at version {snapshot.version} cannot be "
                                  f"restored: {exc}") from exc
        with self._lock:
            if self._model is not None:
                raise PSError("restore needs an empty shard: InitModel came first.")
            self._model = model
            self._version = max(snapshot.version, self._min_version)
            self._steps = (snapshot.version if snapshot.table_steps is None
                           else snapshot.table_steps)
            self._applied_sequence = dict(snapshot.applied_sequences)
            self._applied_pushes = collections.Counter(snapshot.applied_pushes)
            # Files written before variables had options: the workers' InitModel says.
            self._options_pending = bool(snapshot.dense) and not snapshot.variable_options
            self._version_changed.notify_all()

    def pull(self, known_version=-1, min_version=0, timeout_s=0.0, averaged=False,
             known_incarnation=0):
        """The current values, or none when `known_version` is the current version.

        Args:
            known_version: the version the caller holds (-1: none), of the shard incarnation
                `known_incarnation` (another than this one's: values are sent).
            min_version: wait up to `timeout_s` for the version to reach this first
                (synchronous training: until the caller's round has been applied).
            averaged: the optimizer's moving averages in place of the trainable variables'
                values, where it keeps them (`use_ema`): what Keras's `fit` ends with.

        Returns:
            A `PullResult`; `initialized` is False (and `dense` empty) before InitModel.
        """
        with self._lock:
            # Waiting for a round of an earlier run of this shard would wait for nothing.
            if known_incarnation not in (0, self.incarnation):
                min_version = 0
            if min_version > self._version and timeout_s > 0:
                self._version_changed.wait_for(lambda: self._version >= min_version, timeout_s)
            model, version = self._model, self._version
            if model is None or (known_version == version
                                 and known_incarnation in (0, self.incarnation)):
                return PullResult(initialized=model is not None, model_version=version, dense={},
                                  incarnation=self.incarnation)
            # A read is a snapshot: TF copies a variable's buffer before updating it while a
            # read tensor still refers to it, so converting outside the lock is safe.
            tensors = {name: v.read_value() for name, v in model.variables.items()}
            if averaged:
                tensors.update(model.applier.averaged())
        return PullResult(
            initialized=True,
            model_version=version,
            dense={name: np.asarray(t) for name, t in tensors.items()},
            incarnation=self.incarnation,
        )

    def push(self, push):
        """Applies a push at once (asynchronous training) and bumps the version by one.

        A push whose sequence is not above the highest one applied for its worker was
        applied before: it is acknowledged with reason `DUPLICATE` and not applied again.

        Returns:
            A `PushResult`.

        Raises:
            NotReadyError: the shard has no model yet.
            PayloadError: see `updates.prepare_update`; nothing is changed.

        Deltas of non-trainable variables are added when the push is applied (in a
        synchronous round, the round's deltas summed): each minibatch makes its update.
        """
        model = self._model
        if model is None:
            raise NotReadyError(
                "PushGradients needs an initialised shard: InitModel must come first. "
                f"Received: a push from worker {push.worker_id} before InitModel"
            )
        dense = tuple((n, g) for n, g in push.gradients if n not in model.tables)
        rows = {n: _check_rows(model.tables[n], g) for n, g in push.gradients
                if n in model.tables}
        update = prepare_update(model.specs, dense, push.deltas)
        with self._lock:
            last = self._applied_sequence.get(push.worker_id)
            if last is not None and push.sequence <= last:
                return PushResult(accepted=True, model_version=self._version, reason=DUPLICATE)
            hold = self._live_hold()
            if hold is not None and hold.holds(push.worker_id, push.sequence):
                self._version_changed.notify_all()  # a cut may wait for this worker
                return PushResult(accepted=False, model_version=self._version, held=True,
                                  reason=f"{HELD}: the shard is taking checkpoint "
                                  f"{hold.checkpoint_id}")
            stale = self._why_stale(push)
            if stale:
                self.staleness.rejections += 1
                return PushResult(accepted=False, model_version=self._version, stale=True,
                                  reason=f"{STALE}: {stale}")
            staleness = self._version - push.model_version
            self._applied_sequence[push.worker_id] = push.sequence
            self._version_changed.notify_all()  # a checkpoint may wait for this sequence
            if self.policy.sync:
                self._round.add(push.worker_id, update.gradients, rows, update.deltas)
                if self._round.count >= max(self._round_size, 1):
                    self._close_round(model)
            else:
                self.staleness.add(staleness)
                self._apply(model, update.gradients, rows, update.deltas,
                            self.policy.lr_scale(staleness))
                self._applied_pushes[push.worker_id] += 1
            return PushResult(accepted=True, model_version=self._version)

    def _why_stale(self, push):
        """Why `push` must be recomputed against fresh values, or "" if it need not."""
        if push.incarnation not in (0, self.incarnation):
            return ("computed against values of an earlier run of this shard, which has "
                    f"restarted since (now at version {self._version})")
        staleness = self._version - push.model_version
        if staleness < 0:
            return (f"computed against version {push.model_version}, which the shard at "
                    f"version {self._version} has not reached (it was restored)")
        if self.policy.sync and staleness != 0 or self.policy.too_stale(staleness):
            return (f"computed against version {push.model_version}, the shard is at "
                    f"version {self._version}")
        return ""

    def _apply(self, model, gradients, rows, deltas, lr_scale=1.0):
        """One optimizer step on the dense variables and table rows, the non-trainable
        variables' deltas added; bumps the version."""
        model.applier.apply(gradients, lr_scale)
        for name, (ids, grads) in rows.items():
            model.tables[name].apply(ids, grads, model.sparse_optimizer, self._steps + 1,
                                     lr_scale)
        for name, delta in deltas.items():
            variable = model.variables[name]
            variable.assign(variable.numpy() + delta)
        self._version += 1
        self._steps += 1
        self._version_changed.notify_all()

    def _close_round(self, model):
        gradients, rows, deltas = self._round.averaged(self._round.count)
        workers, self._round = self._round.workers, SyncRound()
        self._apply(model, gradients, rows, deltas)
        self._applied_pushes.update(workers)

    @property
    def pending_pushes(self):
        """Pushes in the open synchronous round."""
        return self._round.count

    def set_round_size(self, size):
        """Pushes that close a synchronous round from now on: at most `grads_to_wait`, fewer
        while fewer workers have training work (0: apply any open round at once)."""
        with self._lock:
            self._round_size = min(max(size, 0), self.policy.grads_to_wait)
            if self._model is not None and self._round.count >= max(self._round_size, 1):
                self._close_round(self._model)

    def close_expired_round(self):
        """Applies a synchronous round that has waited longer than the policy's timeout.

        Returns the number of pushes it held (0: nothing to do).
        """
        with self._lock:
            if self._model is None or not self._round.expired(self.policy.round_timeout_s):
                return 0
            count = self._round.count
            self._close_round(self._model)
            return count

    def _require_model(self, what):
        model = self._model
        if model is None:
            raise NotReadyError(f"{what} needs an initialised shard: InitModel must come first.")
        return model

    def _table(self, model, name, what):
        table = model.tables.get(name)
        if table is None:
            raise PayloadError(
                f"{what}: this shard holds no embedding table {name!r}; it holds "
                f"{sorted(model.tables) or 'none'}. Received: table={name!r}"
            )
        return table

    def pull_embeddings(self, ids_by_table):
        """Rows of embedding tables, `{table: ids}` -> `{table: [len(ids), dim] rows}`.

        Rows looked up for the first time are created with the table's initializer, the same
        on any shard and after any restart.

        Raises:
            NotReadyError: before InitModel. PayloadError: an unknown table or bad ids.
        """
        model = self._require_model("PullEmbedding")
        tables = [(self._table(model, name, "PullEmbedding"), np.asarray(ids))
                  for name, ids in ids_by_table]
        for table, ids in tables:
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise PayloadError(
                    f"PullEmbedding {table.name!r}: ids must be a 1-D integer tensor. "
                    f"Received: dtype={ids.dtype.name}, shape={list(ids.shape)}"
                )
        with self._lock:
            return {table.name: table.rows(ids) for table, ids in tables}, self._version

    def table_rows(self, name, chunk_rows):
        """Every row of table `name` this shard holds, as `(ids, rows)` chunks."""
        model = self._require_model("PullTable")
        table = self._table(model, name, "PullTable")
        with self._lock:
            chunks = [(np.array(ids), np.array(rows)) for ids, rows in table.export(chunk_rows)]
        return chunks


def _new_model(values, optimizer_config, tables, options):
    """The `_Model` of checked initial values, optimizer config, tables and options.

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
    return _Model(
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
            )
            for t in tables
        },
        sparse_optimizer=sparse_optimizer,
        optimizer_config=optimizer_config,
        table_configs=tuple(tables),
        variable_options=options,
    )


def _with_options(model, options):
    """`model` rebuilt with the variables' `options` (which are trainable, constrained,
    decayed), keeping values, tables and the optimizer's state of the trainable variables.

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
                               table_configs=model.table_configs)


def _constraint(options):
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


def _restore_tables(model, states, sparse_optimizer):
    """Replaces the empty tables of a new `model` with tables holding `states`' rows."""
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
        )


def _check_tables(tables, dense_values):
    checked = []
    for table in tables:
        what = f"Embedding table {table.name!r}"
        if not table.name or table.name in dense_values:
            raise PayloadError(f"{what}: needs a name unlike any dense variable's. "
                               f"Received: name={table.name!r}")
        if table.dim < 1 or table.input_dim < 0:
            raise PayloadError(f"{what}: dim must be >= 1 and input_dim >= 0. "
                               f"Received: dim={table.dim}, input_dim={table.input_dim}")
        if np.dtype(table.dtype or "float32").kind != "f":
            raise PayloadError(f"{what}: rows must be floating point. "
                               f"Received: dtype={table.dtype!r}")
        try:
            check_initializer(table.initializer or "uniform", table.input_dim)
        except ModelSpecError as exc:
            raise PayloadError(f"{what}: {exc}") from exc
        checked.append(table)
    names = [t.name for t in checked]
    if len(set(names)) != len(names):
        raise PayloadError(f"Embedding table names must be unique. Received: {names}")
    return checked


def _check_rows(table, value):
    """(ids, grads) of a push's rows for `table`, checked before anything changes."""
    what = f"Gradient of table {table.name!r}"
    if not isinstance(value, Slices):
        raise PayloadError(f"{what}: must be sparse rows with ids. Received: a dense tensor")
    ids, grads = value.ids, value.values
    if grads.ndim != 2 or grads.shape[1] != table.dim:
        raise PayloadError(f"{what}: rows must have shape [n, {table.dim}]. "
                           f"Received: shape={list(grads.shape)}")
    if grads.dtype.kind != "f":
        raise PayloadError(f"{what}: rows must be floating point. "
                           f"Received: dtype={grads.dtype.name}")
    if table.input_dim and len(ids) and (ids.min() < 0 or ids.max() >= table.input_dim):
        raise PayloadError(f"{what}: ids must be in [0, {table.input_dim}). "
                           f"Received: ids from {ids.min()} to {ids.max()}")
    return ids, grads
