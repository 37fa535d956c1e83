"""Holding a shard's pushes back while it takes a checkpoint, until it has the cut.

A checkpoint must hold, on every shard, the updates of the same minibatches. The master
takes one in two calls (see `master/checkpoints.py`):

1. PrepareCheckpoint: the shard begins a `Hold`. From then on every push is held back
   (answered `held`; the worker sends it again later) for at most `hold_s` seconds, and the
   shard answers, per worker, the highest sequence it has applied.
2. SaveCheckpoint with the cut (per worker, the highest sequence any shard applied): the
   shard lets through the held pushes the cut holds, waits until it has applied every
   minibatch of the cut (or the worker has moved past one, which was dropped here), then
   snapshots and lets every push through again.

A hold also ends when the master releases it, when another checkpoint begins, and when its
time is up; pushes then go through again.

`PushGate` keeps a shard's one hold. It takes no lock of its own: the shard calls it with
its lock held, and the gate waits on the shard's condition, which the shard notifies
whenever it applies a sequence.

Example:

    >>> import threading
    >>> changed = threading.Condition()
    >>> gate = PushGate(changed)
    >>> with changed:
    ...     gate.begin(checkpoint_id=7, hold_s=10)
    ...     gate.held_answer(worker_id=0, sequence=3, version=5).reason
    'held: the shard is taking checkpoint 7'
    >>> with changed:
    ...     gate.wait_for_cut(7, {0: 2}, applied={0: 2})
    ...     gate.held_answer(worker_id=0, sequence=3, version=5) is None
    True
"""

import dataclasses
import time

from elastic_keras.common.errors import NotReadyError
from elastic_keras.ps.shard_types import HELD, PushResult


@dataclasses.dataclass
class Hold:
    """A checkpoint being taken: pushes are held until `until`, except those the cut holds.

    Attributes:
        checkpoint_id: the checkpoint PrepareCheckpoint began.
        until: the `time.monotonic()` at which the hold ends by itself.
        cut: `{worker id: the highest sequence of the checkpoint}`, once SaveCheckpoint
            gave it (None before).
        held: `{worker id: the highest sequence held back}`.
    """

    checkpoint_id: int
    until: float
    cut: dict = None
    held: dict = dataclasses.field(default_factory=dict)

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


class PushGate:
    """Lets a shard's pushes through, or holds them back while a checkpoint is taken.

    Every method must be called with `changed`'s lock held.

    Args:
        changed: the shard's `threading.Condition`, notified whenever the shard applies a
            sequence; the gate notifies it too when it holds a push back or ends a hold.
    """

    def __init__(self, changed):
        self._changed = changed
        self._hold = None

    def begin(self, checkpoint_id, hold_s):
        """Holds every push from now on, for up to `hold_s` seconds; ends any earlier hold."""
        self._hold = Hold(checkpoint_id, time.monotonic() + hold_s)

    @property
    def holding(self):
        """Whether a hold began and has not been ended (it may have run out): readable
        without the lock, as a hint."""
        return self._hold is not None

    def held_answer(self, worker_id, sequence, version):
        """The answer to a push of (`worker_id`, `sequence`) that a checkpoint holds back,
        from a shard at `version`; None when the push may go through."""
        hold = self._live_hold()
        if hold is None or not hold.holds(worker_id, sequence):
            return None
        self._changed.notify_all()  # a cut may wait for this worker
        return PushResult(accepted=False, model_version=version, held=True,
                          reason=f"{HELD}: the shard is taking checkpoint {hold.checkpoint_id}")

    def wait_for_cut(self, checkpoint_id, cut, applied):
        """Waits, until the hold ends, for the shard to reach `cut`; then ends the hold.

        The held pushes the cut holds go through from now on.

        Args:
            checkpoint_id: the checkpoint `begin` began.
            cut: `{worker id: the highest sequence the checkpoint holds}`.
            applied: the shard's `{worker id: the highest sequence applied}`, which it
                updates while this waits.

        Raises:
            NotReadyError: no hold of this checkpoint (it ended, or another began), or the
                cut was not reached before the hold ended; pushes go through again.
        """
        hold = self._live_hold()
        if hold is None or hold.checkpoint_id != checkpoint_id:
            raise NotReadyError(
                f"SaveCheckpoint {checkpoint_id}: this shard holds no pushes for it (its "
                f"hold ended or another checkpoint began). Received: checkpoint_id="
                f"{checkpoint_id}"
            )
        hold.cut = dict(cut)
        reached = self._changed.wait_for(
            lambda: self._hold is not hold or hold.reached(applied),
            max(0.0, hold.until - time.monotonic()))
        if not reached or self._hold is not hold:
            if self._hold is hold:
                self._hold = None
            missing = {w: s for w, s in cut.items() if applied.get(w, -1) < s}
            raise NotReadyError(
                f"SaveCheckpoint {checkpoint_id}: the shard did not receive every "
                "minibatch of the cut before its hold ended; the checkpoint is abandoned. "
                f"Received: missing sequences {missing}"
            )
        self._hold = None
        self._changed.notify_all()

    def release(self, checkpoint_id):
        """Ends the hold of checkpoint `checkpoint_id`, if it is the one being taken."""
        if self._hold is not None and self._hold.checkpoint_id == checkpoint_id:
            self._hold = None
            self._changed.notify_all()

    def _live_hold(self):
        """The hold being taken, None once its time is up."""
        if self._hold is not None and time.monotonic() > self._hold.until:
            self._hold = None
        return self._hold
