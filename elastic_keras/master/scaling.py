"""`elastic-keras scale`: the number of workers a job is asked to run, and acting on it.

The servicer records a request (`request`, from a gRPC thread); the master's loop acts on it
(`apply`): new workers get new ids, removed ones (the highest ids) get SIGTERM, hand their
task back and exit. The last worker is never removed.
"""

import logging
import threading

from elastic_keras.master.instance_manager import RoleType

logger = logging.getLogger(__name__)


class Scaling:
    """The workers asked for (`target`) and those acted on, for a job that started
    `num_workers`."""

    def __init__(self, num_workers):
        self._lock = threading.Lock()
        self._target = num_workers    # what `elastic-keras scale` asked for
        self._applied = num_workers   # what the loop has acted on
        self._next_id = num_workers

    @property
    def target(self):
        with self._lock:
            return self._target

    def request(self, num_workers, roles):
        """Sets the number of workers from now on; returns (previous target, running)."""
        with self._lock:
            previous, self._target = self._target, num_workers
        logger.info("Scale request: %d -> %d workers", previous, num_workers)
        return previous, roles.count(RoleType.WORKER)

    def apply(self, roles, no_more_tasks):
        """Starts or stops workers of `roles` (a `Roles`) as the last request asks; starts
        none once `no_more_tasks`."""
        target = self.target
        change, self._applied = target - self._applied, target
        if change > 0 and not no_more_tasks:
            for _ in range(change):
                worker_id, self._next_id = self._next_id, self._next_id + 1
                roles.start_worker(worker_id)
                logger.info("Scaled up: started worker-%d", worker_id)
        elif change < 0:
            active = roles.workers()
            for worker_id in active[len(active) + change:] if len(active) > 1 else ():
                roles.leave(worker_id)
                logger.info("Scaled down: asked worker-%d to hand its task back and leave",
                            worker_id)
