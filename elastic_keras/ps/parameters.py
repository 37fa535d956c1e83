"""One shard's parameters: initialisation, pulls and gradient pushes, in rounds or at once.

`Parameters` is the parameter server's domain object; it knows nothing of gRPC. It holds
the shard's model (`shard_model`), the model version, and the highest sequence number
applied per worker. The `UpdatePolicy` (`consistency`) says how pushes become updates:
asynchronous, each push is applied at once and bumps the version; synchronous, pushes of
the current version are averaged in a round, applied and the version bumped once when the
round is full (`grads_to_wait` pushes, fewer while fewer workers have training work) or
has waited `round_timeout_s`. A push is checked completely before anything changes, and
applied at most once: its sequence is recorded only once it is applied (or added to its
round), so a push that fails leaves its sequence free for a retry.

A push without gradients or deltas is acknowledged and its sequence recorded; asynchronous,
it changes nothing (no version bump); synchronous, it counts in its round as a zero
contribution (the workers wait for the round's version). A push holding NaN or Inf is
refused or skipped as the shard's `PayloadLimits` say (see `limits`); a skipped one is
treated as empty. Either way `non_finite_pushes` counts it.

Example:

    >>> import json, keras, numpy as np
    >>> from elastic_keras.ps.shard_types import Push
    >>> params = Parameters()
    >>> sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
    >>> params.init_model([("w", np.array([1.0, 2.0], "float32"))], sgd)
    InitResult(initialized_now=True, model_version=0)
    >>> params.push(Push(worker_id=0, sequence=1, gradients=[("w", np.ones(2, "float32"))]))
    PushResult(accepted=True, model_version=1, reason='', stale=False, held=False)
    >>> params.pull().dense["w"].tolist()
    [0.5, 1.5]

`snapshot()` copies the whole state as plain data (for checkpoints, see `ps/checkpoint.py`)
and `restore()` starts an empty shard from one; `prepare_checkpoint` and `snapshot_at_cut`
take a snapshot at a checkpoint's cut (see `checkpoint_hold`); they live in
`shard_snapshots.SnapshotMixin`.
"""

import collections
import secrets
import threading

import numpy as np

from elastic_keras.common.errors import (
    ApplyError, NotReadyError, PayloadError, ReplacedLaunchError,
)
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.ps.checkpoint_hold import PushGate
from elastic_keras.ps.consistency import (
    StalenessStats, SyncRound, UpdatePolicy, check_push_version,
)
from elastic_keras.ps.learning_rate import LearningRateMixin
from elastic_keras.ps.shard_model import build_model, warmed, with_options
from elastic_keras.ps.shard_snapshots import SnapshotMixin
from elastic_keras.ps.shard_types import (
    DUPLICATE, SKIPPED, STALE, InitResult, PullResult, PushResult,
)
from elastic_keras.ps.table_lifecycle import ShardLifecycle
from elastic_keras.ps.updates import PreparedUpdate, check_sizes, non_finite, non_finite_error


class Parameters(SnapshotMixin, LearningRateMixin):
    """The model, model version and applied sequences of one parameter-server shard.

    Thread-safe: checking and casting a push happen outside the lock; applying it, pulls'
    snapshots and initialisation happen under it.

    `incarnation` is a random number fixed for this object's life: a shard process that
    restarts (restored from a checkpoint, or initialised again) gets another, so a worker's
    values and gradients of an earlier run are never taken for current ones, whatever
    their version numbers.

    Args:
        policy: the `UpdatePolicy` (synchronous rounds or asynchronous pushes).
        min_version: the version a model starts at, and the least a restored one takes: the
            highest a restarted shard had reached (as the master knows it).
        limits: the `PayloadLimits` requests are checked against.
        learning_rate: the rate the job's callbacks set (None: the optimizer's own).
        lifecycle: the `ShardLifecycle` of the tables' admission, eviction and budgets.
    """

    def __init__(self, policy=UpdatePolicy(), min_version=0, limits=PayloadLimits(),
                 learning_rate=None, lifecycle=ShardLifecycle()):
        self.policy = policy
        self.lifecycle = lifecycle
        self._learning_rate = learning_rate  # set by the master; applied to every model
        self.limits = limits
        self.non_finite_pushes = 0  # pushes holding NaN or Inf, refused or skipped
        self._min_version = min_version
        self.incarnation = secrets.randbits(63) or 1
        self._lock = threading.Lock()
        self._version_changed = threading.Condition(self._lock)  # also: sequences applied
        self._gate = PushGate(self._version_changed)
        self._options_pending = False  # restored from a file without variable options
        self._model = None
        self._version = min_version
        self._steps = 0  # updates applied: the step of the tables' sparse optimizer
        self._applied_sequence = {}
        self._applied_launch = {}  # worker id -> the launch of its last applied push
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

    def applied_sequence(self, worker_id, launch=None):
        """The highest push sequence of `worker_id` this shard applied (0: none), if it was
        pushed by `launch` of the worker or by one not known (0 for another launch)."""
        with self._lock:
            known = self._applied_launch.get(worker_id)
            if launch is not None and known is not None and known != launch:
                return 0
            return self._applied_sequence.get(worker_id, 0)

    @property
    def applied_pushes(self):
        """`{worker id: pushes whose updates this shard holds}`."""
        with self._lock:
            return dict(self._applied_pushes)

    @property
    def table_stats(self):
        """`{table: {"rows", "bytes", and its `TableCounters`}}` (empty without a model)."""
        with self._lock:
            return self._model.table_stats() if self._model else {}

    @property
    def pending_pushes(self):
        """Pushes in the open synchronous round."""
        return self._round.count

    def init_model(self, dense, optimizer_config, tables=(), options=()):
        """Initialises the shard at its `min_version`, unless it already holds a model.

        Of several concurrent calls exactly one initialises; the others keep its model. A
        shard restored from a file written before variables had options takes them from
        the first call that gives some.

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
            PayloadError: a bad tensor list, optimizer config, table config or option, or
                one above the `limits` (checked on every call, before anything changes).
        """
        check_sizes(dense, tables, self.limits)
        model = build_model(dense, optimizer_config, tables, options, self.lifecycle)
        with self._lock:
            if self._model is not None:
                if self._options_pending and model.variable_options:
                    self._model = with_options(self._model, model.variable_options)
                    self._options_pending = False
                return InitResult(initialized_now=False, model_version=self._version)
            self._model = warmed(self._with_set_rate(model))
            self._version = self._min_version
            return InitResult(initialized_now=True, model_version=self._version)

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
        """Applies a push at once (asynchronous), or adds it to the open synchronous round,
        which is applied, its gradients averaged, when full (see `set_round_size`).

        Deltas of non-trainable variables are added when the push is applied (a round's
        deltas summed): each minibatch makes its update. A push whose sequence is not above
        the highest one applied for its worker was applied before: it is acknowledged with
        reason `DUPLICATE` and not applied again. A push a checkpoint holds back is answered
        `held`, one computed against values the shard no longer has `stale`. One holding
        NaN or Inf is refused, or acknowledged with reason `SKIPPED` (see the module).

        Returns:
            A `PushResult`.

        Raises:
            NotReadyError: the shard has no model yet.
            PayloadError: see `ShardModel.prepare` and `consistency.check_push_version`;
                `NonFiniteError` for NaN or Inf (`--non-finite-gradients fail`). Nothing is
                changed and the sequence stays free.
            ApplyError: TensorFlow failed to apply the checked update; the sequence stays free.
        """
        model = self._model
        if model is None:
            raise NotReadyError(
                "PushGradients needs an initialised shard: InitModel must come first. "
                f"Received: a push from worker {push.worker_id} before InitModel"
            )
        update, rows = model.prepare(push.gradients, push.deltas)
        found = non_finite(push.gradients, push.deltas)
        with self._lock:
            refused = self._refusal_locked(push)
            if refused is not None:
                return refused
            if found:
                self.non_finite_pushes += 1
                if not self.limits.skip_non_finite:
                    raise non_finite_error(found, push)
                update, rows = PreparedUpdate({}, {}), {}
            self._add_locked(model, push, update, rows)
            self._applied_sequence[push.worker_id] = push.sequence
            if push.launch is not None:
                self._applied_launch[push.worker_id] = push.launch
            self._version_changed.notify_all()  # a checkpoint may wait for this sequence
            return PushResult(accepted=True, model_version=self._version,
                              reason=f"{SKIPPED}: {found[0][0]} holds NaN or Inf" if found else "")

    def _add_locked(self, model, push, update, rows):
        """Applies a checked push (asynchronous; an empty one changes nothing) or adds it to
        the open round, closing it when full; on `ApplyError` the round is as it was."""
        if self.policy.sync:
            closes = self._round.count + 1 >= max(self._round_size, 1)
            before = self._round.copy() if closes else None  # once a round, not per push
            self._round.add(push.worker_id, update.gradients, rows, update.deltas)
            if closes:
                try:
                    self._close_round(model)
                except ApplyError:
                    self._round = before
                    raise
            return
        if update.gradients or update.deltas or rows:
            staleness = self._version - push.model_version
            self._apply(model, update.gradients, rows, update.deltas,
                        self.policy.lr_scale(staleness))
            self.staleness.add(staleness)
        self._applied_pushes[push.worker_id] += 1

    @property
    def round_size(self):
        """Pushes that close a synchronous round now (0 when training asynchronously)."""
        with self._lock:
            return self._round_size

    def set_round_size(self, size):
        """Pushes that close a synchronous round from now on, as the master decides them
        (fewer than `grads_to_wait` while fewer workers have training work; 0: apply any
        open round at once)."""
        with self._lock:
            self._round_size = max(size, 0)
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

    def pull_embeddings(self, ids_by_table, read_only=False):
        """Rows of embedding tables, `{table: ids}` -> `{table: [len(ids), dim] rows}`.

        In training, rows looked up for the first time are created (the same on any shard,
        after any restart) once their ids are admitted, and a shard over its row budget
        evicts after (see `EmbeddingTable.rows`); `read_only` (inference) changes nothing.

        Raises:
            NotReadyError: before InitModel. PayloadError: an unknown table or bad ids.
        """
        model = self._require_model("PullEmbedding")
        lookups = model.lookups(ids_by_table, "PullEmbedding")
        with self._lock:
            rows = {table.name: table.rows(ids, training=not read_only) for table, ids in lookups}
            if not read_only:
                model.keep_in_bounds(None, self.lifecycle.max_rows_per_shard)
            return rows, self._version

    def table_rows(self, name, chunk_rows):
        """Every row of table `name` this shard holds, as `(ids, rows)` chunks.

        Raises:
            NotReadyError: before InitModel. PayloadError: an unknown table, or
                `chunk_rows` < 1.
        """
        if chunk_rows < 1:
            raise PayloadError(f"PullTable {name!r}: rows_per_chunk must be 1 or more (0: the "
                               f"shard's default). Received: rows_per_chunk={chunk_rows}")
        model = self._require_model("PullTable")
        table = model.table(name, "PullTable")
        with self._lock:
            chunks = [(np.array(ids), np.array(rows)) for ids, rows in table.export(chunk_rows)]
        return chunks

    def _require_model(self, what):
        model = self._model
        if model is None:
            raise NotReadyError(f"{what} needs an initialised shard: InitModel must come first.")
        return model

    def _refusal_locked(self, push):
        """The answer to a push that must not be applied (a duplicate, one a checkpoint
        holds back, a stale one), else None (lock held)."""
        last = self._applied_sequence.get(push.worker_id)
        known = self._applied_launch.get(push.worker_id)
        if push.launch is not None and known is not None and push.launch != known:
            if push.launch < known:
                raise ReplacedLaunchError(
                    f"Worker {push.worker_id} launch {push.launch} has been replaced by launch "
                    f"{known}: its pushes apply no more. Received: sequence {push.sequence}")
            last = None  # a new launch: its sequences are its own
        if last is not None and push.sequence <= last:
            return PushResult(accepted=True, model_version=self._version, reason=DUPLICATE)
        held = self._gate.held_answer(push.worker_id, push.sequence, self._version)
        if held is not None:
            return held
        check_push_version(push, self._version, self.incarnation)
        stale = self._why_stale(push)
        if stale:
            self.staleness.rejections += 1
            return PushResult(accepted=False, model_version=self._version, stale=True,
                              reason=f"{STALE}: {stale}")
        return None

    def _why_stale(self, push):
        """Why `push` must be recomputed against fresh values, or "" if it need not."""
        if push.incarnation not in (0, self.incarnation):
            return ("computed against values of an earlier run of this shard, which has "
                    f"restarted since (now at version {self._version})")
        return self.policy.why_stale(self._version, push.model_version)

    def _apply(self, model, gradients, rows, deltas, lr_scale=1.0):
        """One update of the model (see `ShardModel.apply`); bumps the version.

        Raises:
            ApplyError: TensorFlow failed (the version stays; the push was checked, so this
                is a fault of the shard's, not of the push).
        """
        try:
            model.apply(gradients, rows, deltas, self._steps + 1, lr_scale)
        except Exception as exc:  # TF raises many kinds; the caller answers INTERNAL
            raise ApplyError(f"Applying an update at version {self._version} failed: "
                             f"{type(exc).__name__}: {exc}") from exc
        self._version += 1
        self._steps += 1
        model.keep_in_bounds(self._steps, self.lifecycle.max_rows_per_shard)
        self._version_changed.notify_all()

    def _close_round(self, model):
        """Applies the open synchronous round, its gradients averaged over its pushes; on
        `ApplyError` the round stays open."""
        gradients, rows, deltas = self._round.averaged(self._round.count)
        self._apply(model, gradients, rows, deltas)
        self._applied_pushes.update(self._round.workers)
        self._round = SyncRound()
