"""The account of every training minibatch's pushes: trained by workers, applied by shards.

Workers report, per task attempt, how many minibatches they trained whose pushes settled
(applied on every shard, or given up on by some) and which shards never applied one, and
why; shards report how many pushes of each worker they hold. On every shard each minibatch
is applied at most once, so for a job whose roles all lived:

    applied[shard][worker] == minibatches[worker] - dropped[worker][shard]

A worker that dies may leave its last unreported minibatches out of its count while
shards applied them; a shard restored from a checkpoint holds (and counts) only the pushes
its checkpoint held.

Example:

    >>> account = PushAccount()
    >>> account.report(task_id=1, worker_id=0, minibatches=8, dropped={1: "stale"})
    >>> account.by_worker()
    {'0': {'minibatches': 8, 'dropped': {'ps-1': {'stale': 1}}}}
"""

import collections
import threading


class PushAccount:
    """Minibatches and dropped pushes per worker, from reports that may repeat; thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._attempts = {}  # task id -> (worker id, minibatches, {ps id: reason})

    def report(self, task_id, worker_id, minibatches, dropped=None):
        """Records a task attempt's counts so far (each report counts from its start, so a
        repeated or late one changes nothing)."""
        with self._lock:
            _, known, known_dropped = self._attempts.get(task_id, (worker_id, 0, {}))
            self._attempts[task_id] = (worker_id, max(known, minibatches),
                                       {**known_dropped, **(dropped or {})})

    def by_worker(self):
        """`{worker id: {"minibatches": n, "dropped": {"ps-i": {reason: n}}}}`, ids as text."""
        totals = collections.defaultdict(lambda: {"minibatches": 0, "dropped": {}})
        with self._lock:
            attempts = list(self._attempts.values())
        for worker_id, minibatches, dropped in sorted(attempts, key=lambda a: a[0]):
            entry = totals[str(worker_id)]
            entry["minibatches"] += minibatches
            for ps_id, reason in sorted(dropped.items()):
                reasons = entry["dropped"].setdefault(f"ps-{ps_id}", {})
                reasons[reason] = reasons.get(reason, 0) + 1
        return dict(totals)
