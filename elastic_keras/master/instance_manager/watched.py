"""The bookkeeping of engines that learn of exits from a watch of their own (Kubernetes pods,
Ray actors) rather than from a child process: the current launch of each role, the exits not
yet polled, and waiting for launches to be seen ended."""

import threading
import time

from elastic_keras.master.instance_manager.api import InstanceManager


class WatchedInstanceManager(InstanceManager):
    """An engine whose watch thread records exits with `_end`.

    Subclasses keep each role's current launch (an object with `spec`, `stopping` and `ended`
    attributes) in `_current`, under `_lock`.
    """

    def __init__(self):
        self._current = {}  # role name -> its current launch
        self._exits = []    # `RoleExit`s not polled yet
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)

    def poll(self):
        with self._lock:
            exits, self._exits = self._exits, []
        return exits

    def running(self):
        with self._lock:
            return [launch.spec for launch in self._current.values()]

    def _claim(self, names):
        """The current launches of roles `names`, marked as being stopped by the engine."""
        with self._lock:
            launches = [self._current[n] for n in names if n in self._current]
            for launch in launches:
                launch.stopping = True
        return launches

    def _wait_ended(self, launches, timeout_s):
        """Whether every one of `launches` is seen ended within `timeout_s` seconds."""
        deadline = time.monotonic() + timeout_s
        with self._changed:
            return self._changed.wait_for(lambda: all(l.ended for l in launches),
                                          timeout=max(0.0, deadline - time.monotonic()))

    def _end(self, launch, ended):
        """Records that `launch` ended as `ended` (a `RoleExit`), once; the lock held."""
        if launch.ended is not None:
            return False
        launch.ended = ended
        if self._current.get(launch.spec.name) is launch:
            del self._current[launch.spec.name]
        self._exits.append(ended)
        self._changed.notify_all()
        return True
