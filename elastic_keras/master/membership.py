"""Who is in the job: parameter-server addresses, registered workers, heartbeats, versions."""

import threading
import time


class Membership:
    """What the master knows of its roles; thread-safe."""

    def __init__(self, num_ps):
        self.num_ps = num_ps
        self._lock = threading.Lock()
        self._ps = {}
        self._ps_versions = {}
        self._workers = set()
        self._last_seen = {}

    def register_ps(self, ps_id, address):
        with self._lock:
            self._ps[ps_id] = address
            self._last_seen[("ps", ps_id)] = time.monotonic()

    def forget_ps(self, ps_id):
        with self._lock:
            self._ps.pop(ps_id, None)

    def ps_addresses(self):
        """(ready, addresses): ready once every shard has registered."""
        with self._lock:
            if len(self._ps) < self.num_ps:
                return False, []
            return True, [self._ps[i] for i in range(self.num_ps)]

    def register_worker(self, worker_id):
        with self._lock:
            self._workers.add(worker_id)
            self._last_seen[("worker", worker_id)] = time.monotonic()

    def heartbeat(self, role, role_id):
        with self._lock:
            self._last_seen[(role, role_id)] = time.monotonic()

    def report_version(self, ps_id, version):
        with self._lock:
            self._ps_versions[ps_id] = max(version, self._ps_versions.get(ps_id, 0))

    @property
    def model_version(self):
        """The highest version any shard reported."""
        with self._lock:
            return max(self._ps_versions.values(), default=0)
