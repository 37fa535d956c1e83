"""How a shard turns pushes into updates: synchronous rounds or asynchronous staleness rules.

Synchronous (`grads_to_wait` K >= 1): a push must be computed against the shard's current
version. The shard adds it to the open round, which closes when it holds the round size's
pushes: K, or fewer while fewer workers have training work (the size the master sends, see
`Parameters.set_round_size`). The round's gradients are averaged (dense gradients
element-wise; sparse rows by id, an id missing from a push counting as a zero row, which is
the gradient of the mean loss over the union of the round's minibatches) and applied once,
and the version goes up by one. The deltas of non-trainable variables are summed, not
averaged: each minibatch makes its own update (a BatchNormalization statistic moves once
per minibatch, a counter counts every one). A push against an older version is rejected as
stale; the worker pulls and recomputes. A round that has waited `round_timeout_s` since its
first push is applied with the pushes it has, averaged over their number, so a worker that
died or left mid-round cannot stall training.

Asynchronous (K = 0): a push is applied at once. Its staleness is the shard's version minus
the version it was computed against. With `max_staleness` S > 0 a push staler than S is
rejected; with `lr_staleness_modulation` the learning rate of that update is divided by
max(1, staleness).

A push's version must be one the shard could have given: never negative, and, for a push
computed against this very run of the shard (its `incarnation`), never above the shard's
version, which within one run only goes up (`check_push_version` refuses such a push as
malformed). A push computed against another run, or one that does not say which, may carry
a version this run has not reached (the shard restarted from an older checkpoint): it is
answered stale, and the worker pulls and recomputes.
"""

import dataclasses
import time

import numpy as np
import tensorflow as tf

from elastic_keras.common.errors import PayloadError

STALENESS_BUCKETS = 16  # staleness 0 .. 15 counted apiece, 16 and more together


@dataclasses.dataclass(frozen=True)
class UpdatePolicy:
    """A shard's consistency settings; the default is asynchronous with no bound."""

    grads_to_wait: int = 0
    max_staleness: int = 0
    lr_staleness_modulation: bool = False
    round_timeout_s: float = 30.0

    @property
    def sync(self):
        return self.grads_to_wait > 0

    def lr_scale(self, staleness):
        """The learning-rate factor of an asynchronous update of this staleness."""
        return 1.0 / max(1, staleness) if self.lr_staleness_modulation else 1.0

    def too_stale(self, staleness):
        return self.max_staleness > 0 and staleness > self.max_staleness

    def why_stale(self, version, push_version):
        """Why a push computed against `push_version` must be recomputed on a shard at
        `version`, or "" if it may be applied: synchronous, only a push of the current
        version is; asynchronous, one of an earlier version up to `max_staleness` behind.
        A version the shard has not reached (it was restored from a checkpoint) never is.

        Example:

            >>> UpdatePolicy(grads_to_wait=2).why_stale(version=3, push_version=2)
            'computed against version 2, the shard is at version 3'
            >>> UpdatePolicy().why_stale(version=3, push_version=2)
            ''
        """
        staleness = version - push_version
        if staleness < 0:
            return (f"computed against version {push_version}, which the shard at "
                    f"version {version} has not reached (it was restored)")
        if self.sync and staleness != 0 or self.too_stale(staleness):
            return f"computed against version {push_version}, the shard is at version {version}"
        return ""


def check_push_version(push, version, incarnation):
    """Raises `PayloadError` if `push` carries a version no pull of this shard gave: a
    negative one, or one above `version` for the shard's own `incarnation`."""
    if push.model_version < 0 or (push.incarnation == incarnation
                                  and push.model_version > version):
        raise PayloadError(
            f"Push from worker {push.worker_id}: model_version must be one this shard gave "
            f"(0 to its current version {version} in this run, which never goes back). "
            f"Received: model_version={push.model_version}")


class StalenessStats:
    """Counts of applied pushes by staleness, and of pushes rejected as stale."""

    def __init__(self):
        self.counts = [0] * STALENESS_BUCKETS
        self.rejections = 0

    def add(self, staleness):
        self.counts[min(max(staleness, 0), STALENESS_BUCKETS - 1)] += 1


class SyncRound:
    """The pushes gathered for one synchronous update, summed as they arrive."""

    def __init__(self):
        self.started = None
        self.workers = []   # the worker of each push, in order
        self._dense = {}    # name -> summed tensor, or list of IndexedSlices
        self._rows = {}     # table -> [(ids, grads)]
        self._deltas = {}   # name -> summed delta

    @property
    def count(self):
        return len(self.workers)

    def add(self, worker_id, gradients, rows, deltas):
        """Adds one push of `worker_id`: prepared dense `gradients`, table `rows`
        {table: (ids, grads)} and `deltas` {name: array} of non-trainable variables."""
        if self.count == 0:
            self.started = time.monotonic()
        self.workers.append(worker_id)
        for name, delta in deltas.items():
            self._deltas[name] = self._deltas[name] + delta if name in self._deltas else delta
        for name, gradient in gradients.items():
            if isinstance(gradient, tf.IndexedSlices):
                self._dense.setdefault(name, []).append(gradient)
            elif name in self._dense:
                self._dense[name] = self._dense[name] + gradient
            else:
                self._dense[name] = gradient
        for table, pair in rows.items():
            self._rows.setdefault(table, []).append(pair)

    def copy(self):
        """A copy that later `add`s to this round leave as it is (`add` replaces summed
        tensors, never changes one in place)."""
        other = SyncRound()
        other.started, other.workers = self.started, list(self.workers)
        other._dense = {n: list(g) if isinstance(g, list) else g for n, g in self._dense.items()}
        other._rows = {table: list(pairs) for table, pairs in self._rows.items()}
        other._deltas = dict(self._deltas)
        return other

    def expired(self, timeout_s):
        return self.count > 0 and time.monotonic() - self.started >= timeout_s

    def averaged(self, divisor):
        """(dense gradients, table rows, deltas) of the round: gradients divided by
        `divisor`, deltas summed."""
        scale = 1.0 / divisor
        dense = {}
        for name, gradient in self._dense.items():
            if isinstance(gradient, list):
                ids, index = tf.unique(tf.concat([g.indices for g in gradient], 0))
                values = tf.math.unsorted_segment_sum(
                    tf.concat([g.values for g in gradient], 0), index, tf.shape(ids)[0]
                )
                dense[name] = tf.IndexedSlices(values * scale, ids, gradient[0].dense_shape)
            else:
                dense[name] = gradient * scale
        rows = {}
        for table, pairs in self._rows.items():
            ids = np.concatenate([i for i, _ in pairs])
            grads = np.concatenate([g for _, g in pairs]) * np.asarray(scale, pairs[0][1].dtype)
            rows[table] = (ids, grads)  # the table sums repeated ids
        return dense, rows, dict(self._deltas)
