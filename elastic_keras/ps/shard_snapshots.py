"""The checkpoint side of a shard: restoring it from a `Snapshot`, taking one, and the cut.

`SnapshotMixin` gives `Parameters` (its only user) the calls that checkpoints make:
`restore` starts an empty shard from a `Snapshot`, `snapshot` copies the whole shard, and
`prepare_checkpoint`, `snapshot_at_cut`, `release_checkpoint` and `held` take a snapshot at
a checkpoint's cut (see `checkpoint_hold`). It works on the `Parameters` attributes named
in its docstring, under the shard's lock, as the rest of `Parameters` does.
"""

import collections

from elastic_keras.common.errors import PSError
from elastic_keras.ps.shard_model import restore_model, take_snapshot, warmed


class SnapshotMixin:
    """Snapshots and checkpoint cuts of a `Parameters`.

    Uses the shard's `_lock`, `_version_changed`, `_gate`, `_model`, `_version`,
    `_min_version`, `_steps`, `_applied_sequence`, `_applied_pushes`, `_options_pending`,
    `_round`, `_require_model`, `_close_round` and `_with_set_rate`.
    """

    @property
    def table_lifecycles(self):
        """`{table: Lifecycle}` of the tables held; a restored shard holds its checkpoint's
        (InitModel keeps a model it holds). Empty without a model."""
        with self._lock:
            return {name: t.lifecycle for name, t in self._model.tables.items()} if (
                self._model) else {}

    def restore(self, snapshot):
        """Initialises this empty shard from a `Snapshot`, as InitModel then pushes would.

        The model is built as `init_model` builds it, then set from the snapshot (see
        `shard_model.restore_model`), with the version and the applied sequences. A later
        InitModel keeps it. The version is at least `min_version`: never backwards.

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
        model = restore_model(snapshot, self.lifecycle)
        with self._lock:
            if self._model is not None:
                raise PSError("restore needs an empty shard: InitModel came first.")
            self._model = warmed(self._with_set_rate(model))
            self._version = max(snapshot.version, self._min_version)
            self._steps = (snapshot.version if snapshot.table_steps is None
                           else snapshot.table_steps)
            self._applied_sequence = dict(snapshot.applied_sequences)
            self._applied_pushes = collections.Counter(snapshot.applied_pushes)
            # Files written before variables had options: the workers' InitModel says.
            self._options_pending = bool(snapshot.dense) and not snapshot.variable_options
            self._version_changed.notify_all()

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

        Raises:
            NotReadyError: the shard has no model yet.
        """
        self._require_model("PrepareCheckpoint")
        with self._lock:
            self._gate.begin(checkpoint_id, hold_s)
            return dict(self._applied_sequence), self._version

    def snapshot_at_cut(self, checkpoint_id, cut):
        """The `snapshot()` of the checkpoint `prepare_checkpoint` began, once this shard
        has applied every minibatch of `cut` (see `PushGate.wait_for_cut`).

        Raises:
            NotReadyError: no model, no hold of this checkpoint, or the cut was not reached
                before the hold ended; pushes go through again.
        """
        model = self._require_model("SaveCheckpoint")
        with self._lock:
            self._gate.wait_for_cut(checkpoint_id, cut, self._applied_sequence)
            return self._snapshot_locked(model)

    def release_checkpoint(self, checkpoint_id):
        """Ends the hold of checkpoint `checkpoint_id` (the master gave it up)."""
        with self._lock:
            self._gate.release(checkpoint_id)

    def held(self, worker_id, sequence):
        """The answer to a push of (`worker_id`, `sequence`) if a checkpoint holds it back,
        else None: a cheap check before the push is decoded, without the lock while no
        checkpoint holds pushes (`push` checks again under it)."""
        if not self._gate.holding:
            return None
        with self._lock:
            return self._gate.held_answer(worker_id, sequence, self._version)

    def _snapshot_locked(self, model):
        """`snapshot()`, the lock held: applies the open round, then copies the shard."""
        if self._round.count:
            self._close_round(model)
        return take_snapshot(model, self._version, self._applied_sequence,
                             self._applied_pushes, self._steps)
