"""The job's roles as its engine runs them: started from their configs, stopped, watched.

Mechanism only: the master's loop decides when a role starts, is relaunched or is stopped;
`Roles` turns that into the engine's calls and keeps the exits seen.
"""

import threading
import time

from elastic_keras.common import auth
from elastic_keras.common.config import to_argv
from elastic_keras.master.instance_manager import RoleId, RoleSpec, RoleType

WORKER_LEAVE_GRACE_S = 30.0  # a worker scaled away gets this long to hand its task back
_TICK_S = 0.2


class Roles:
    """Starts and stops the parameter servers and workers of one job through `engine`.

    Args:
        config: the job's `JobConfig`.
        engine: the `InstanceManager` that runs the roles.
        secret: the job's secret: a shard gets it (to check its callers), a worker only its
            own credential, made for each launch of it (see `auth`).
        tls_for: `tls_for(role name)`: the role's `TlsMaterial`, or None without TLS.
    """

    def __init__(self, config, engine, secret, tls_for=lambda name: None):
        self.config = config
        self.engine = engine
        self.master_address = ""  # set once the master serves
        self.leaving = set()      # ids of workers stopped by scaling down
        self.failed_exits = []    # `RoleExit`s of roles that did not end well, in this run
        self._secret = secret
        self._tls_for = tls_for
        self._incarnations = {}   # worker id -> its current launch (0 first)
        self._lock = threading.Lock()

    def start_ps(self, ps_id, port=0, restore_from="", min_version=0, learning_rate=-1.0):
        self.engine.start(self.ps_spec(ps_id, port, restore_from, min_version, learning_rate))

    def start_worker(self, worker_id):
        with self._lock:
            incarnation = self._incarnations.get(worker_id, -1) + 1
            self._incarnations[worker_id] = incarnation
        self.engine.start(self.worker_spec(worker_id, incarnation))

    def ps_spec(self, ps_id, port=0, restore_from="", min_version=0, learning_rate=-1.0):
        """The `RoleSpec` of parameter server `ps_id`."""
        config = self.config.ps_config(ps_id, self.master_address, port, restore_from,
                                       min_version, learning_rate)
        role = RoleId(RoleType.PS, ps_id)
        return RoleSpec(role, "elastic_keras.ps", tuple(to_argv(config)),
                        files=(("--secret-file", self._secret),) + self._tls_files(role),
                        advertise_flag="--advertise-host")

    def worker_spec(self, worker_id, incarnation=0):
        """The `RoleSpec` of launch `incarnation` of worker `worker_id`."""
        identity = auth.Identity(auth.Role.WORKER, worker_id, incarnation)
        token = auth.credential(self._secret, self.config.job_name, identity)
        config = self.config.worker_config(worker_id, self.master_address)
        role = RoleId(RoleType.WORKER, worker_id)
        return RoleSpec(role, "elastic_keras.worker", tuple(to_argv(config)),
                        files=(("--credential-file", token.encode()),) + self._tls_files(role))

    def _tls_files(self, role):
        material = self._tls_for(role.name)
        return material.files() if material else ()

    def incarnation(self, worker_id):
        """The launch of worker `worker_id` started last (0 first; None: never started)."""
        with self._lock:
            return self._incarnations.get(worker_id)

    def is_current(self, identity):
        """Whether `identity` is the running launch of its worker (not one it replaced)."""
        with self._lock:
            return self._incarnations.get(identity.index) == identity.incarnation

    def workers(self):
        """Ids of the running workers that are not leaving, in order."""
        return sorted(s.role.index for s in self.engine.running()
                      if s.role.type == RoleType.WORKER and s.role.index not in self.leaving)

    def count(self, role_type):
        """How many roles of `role_type` run (leaving workers included)."""
        return sum(s.role.type == role_type for s in self.engine.running())

    def leave(self, worker_id):
        """Asks a worker to hand its task back and exit (SIGTERM), in the background."""
        self.leaving.add(worker_id)
        self._stop_in_background(RoleId(RoleType.WORKER, worker_id), WORKER_LEAVE_GRACE_S)

    def _stop_in_background(self, role, grace_s):
        """`engine.stop(role, grace_s)` on a thread of its own, which is returned."""
        thread = threading.Thread(target=self.engine.stop, args=(role, grace_s),
                                  name=f"stop-{role.name}", daemon=True)
        thread.start()
        return thread

    def kill(self, role_type, index):
        self.engine.kill(RoleId(RoleType(role_type), index))

    def poll(self):
        """The roles that exited since the last call (`RoleExit`)."""
        return self.engine.poll()

    def wait_for_exits(self, role_type, timeout_s):
        """Waits up to `timeout_s` for every role of `role_type` to exit on its own."""
        deadline = time.monotonic() + timeout_s
        while self.count(role_type) and time.monotonic() < deadline:
            self._keep_failed(self.engine.poll())
            time.sleep(_TICK_S)

    def stop_workers(self, grace_s):
        """Stops every worker, each given `grace_s` to land its last push and hand its task
        back (SIGTERM, then SIGKILL), all at once; returns when none is left."""
        for stop in [self._stop_in_background(spec.role, grace_s)
                     for spec in self.engine.running() if spec.role.type == RoleType.WORKER]:
            stop.join()
        self._keep_failed(self.engine.poll())

    def stop_all(self, grace_s):
        self.engine.stop_all(grace_s)
        self._keep_failed(self.engine.poll())

    def _keep_failed(self, exits):
        self.failed_exits += [e for e in exits if not e.succeeded]
