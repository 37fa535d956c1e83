"""Asynchronous updates with communication overlapped: a step's push, and the pull after it,
run in the background while the next step computes.

That next step then misses this worker's previous update (staleness 1), which asynchronous
training allows; the job uses this strategy only without a staleness bound. A push that a
shard refuses as stale (it restarted) is recomputed and sent to that shard alone once the
push is known to be refused, before the next one goes out.
"""

import concurrent.futures
import threading

from elastic_keras.common.errors import PSError
from elastic_keras.worker.strategies.api import UpdateStrategy, refusal


class Overlapped(UpdateStrategy):
    """Pushes each minibatch and pulls fresh values on one background thread."""

    name = "overlap"

    def __init__(self, replica, max_stale_retries=20):
        super().__init__(replica, max_stale_retries)
        self._background = concurrent.futures.ThreadPoolExecutor(1, "push-pull")
        self._pending = None  # the background push and pull of the previous step
        self._after = []      # futures of `after_landed` calls not yet known to be done

    def train(self, minibatch):
        if not self._replica.has_values:
            self._replica.pull()
        # What this step computes against: the pull `_land` assigned last.
        computed = self._replica.compute(minibatch.features, minibatch.labels)
        self._land()  # the previous push is in and its pull assigned, after this step ran
        future = self._background.submit(self._push_and_pull, minibatch.sequence, computed)
        self._pending = _Pending(future, minibatch)
        return computed.loss

    def _push_and_pull(self, sequence, computed):
        responses = self._replica.push(sequence, computed, then_pull=True)
        return responses, self._replica.fetch()

    def after_landed(self, call):
        """Runs `call()` once every push made so far has landed, without waiting for that:
        on the background thread after the pending push (or, if a shard refused it as
        stale, on this thread once `_land` has sent it again), and not at all if that push
        failed (its exception, or `call`'s, is raised by a later `flush` or `train`); at
        once if no push is pending."""
        pending = self._pending
        if pending is None:
            call()
            return

        def when_landed():
            _accepted(pending)  # done by now (one background thread, first come first run)
            if not pending.defer(call):
                call()

        self._after.append(self._background.submit(when_landed))

    def flush(self):
        """Waits for the background push of the last step to land, and for the
        `after_landed` calls made since.

        Raises:
            PSError: a shard refused it (`PushRefused`). Whatever an `after_landed` call
                raised.
        """
        self._land()
        after, self._after = self._after, []
        for future in after:
            future.result()

    def _land(self):
        """Waits for the pending push and assigns its pull; sends the minibatch again, as
        recomputed, to shards that refused it as stale (they restarted); raises what a
        finished `after_landed` call raised."""
        finished = [f for f in self._after if f.done()]
        self._after = [f for f in self._after if not f.done()]
        for future in finished:
            future.result()
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        try:
            self._replica.assign(_accepted(pending))
            stale = pending.stale_shards()
            if stale:
                self.stale_pushes += 1
                self.settle(pending.minibatch, stale, fresh=False)
        except BaseException:
            self._after = []  # they wait on this push: they fail with it, and are dropped
            pending.finish(failed=True)
            raise
        for call in pending.finish():
            call()


class _Pending:
    """A minibatch's background push and pull, with the minibatch to compute it again.

    `after_landed` calls that come due while a shard's stale refusal is being resent wait
    here (`defer`) until `_land` has settled the minibatch (`finish`)."""

    def __init__(self, future, minibatch):
        self.future, self.minibatch = future, minibatch
        self._lock = threading.Lock()
        self._deferred = []
        self._settled = False
        self._failed = False

    def stale_shards(self):
        responses, _ = self.future.result()
        return [i for i, r in enumerate(responses) if r.stale]

    def defer(self, call):
        """Whether `call` must wait for the minibatch to be resent (it then runs then)."""
        with self._lock:
            if self._failed:
                raise PSError("A push this call waited for was refused.")
            if self._settled or not self.stale_shards():
                return False
            self._deferred.append(call)
            return True

    def finish(self, failed=False):
        """Marks the minibatch landed everywhere (or given up); returns the deferred calls
        to run now."""
        with self._lock:
            self._settled, self._failed = True, failed
            deferred, self._deferred = self._deferred, []
        return [] if failed else deferred


def _accepted(pending):
    """The `Pulled` of a finished background push and pull, if no shard refused the push
    but as stale (which `_land` sends again).

    Raises:
        PushRefused: a shard refused it for another reason. Whatever the push or the pull
            raised.
    """
    responses, pulled = pending.future.result()
    refused = refusal(responses, range(len(responses)))
    if refused is not None:
        raise refused
    return pulled
