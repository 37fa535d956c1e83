"""Roles as local subprocesses: the embedded default engine.

Each role runs its module as `python -m <module> <args>` would, in its own session. Its output
is read line by line, written to `<log_dir>/<role>.log` and handed to `on_line` (the master's
console). On Linux each child also asks the kernel to SIGKILL it when the master dies, so no
role outlives a killed master: a graceful leave (handing a task back, waiting for a push to
land) needs the master, and with it gone the job resumes from its checkpoint when its command
runs again.
"""

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from elastic_keras.common.private_data import write_private
from elastic_keras.master.instance_manager.api import InstanceManager, RoleExit, RoleSpec

logger = logging.getLogger(__name__)

# `python -c CHILD_BOOTSTRAP <parent pid> <module> <args...>`: the child asks for SIGKILL when
# its parent (the master; on Ray the role's actor) dies (PR_SET_PDEATHSIG; elsewhere roles
# notice the master's absence over gRPC), then runs the module as `python -m` does. The child
# does this itself because a `preexec_fn` would make Python fork() rather than vfork(), and
# gRPC's fork handlers can then abort the child before it reaches exec() (grpc/grpc#43055).
CHILD_BOOTSTRAP = """
import ctypes, os, runpy, signal, sys
parent, module = int(sys.argv[1]), sys.argv[2]
try:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
except OSError:
    pass
if os.getppid() != parent:
    sys.exit("the parent is gone")
sys.argv = [module, *sys.argv[3:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def open_role_log(log_dir, role_name):
    """`<log_dir>/<role_name>.log` opened to append (every launch of a role writes to one
    file, on every engine), or None without a `log_dir`."""
    if not log_dir:
        return None
    os.makedirs(log_dir, exist_ok=True)
    return open(os.path.join(log_dir, f"{role_name}.log"), "a", encoding="utf-8")


@dataclasses.dataclass(frozen=True)
class LocalEngineConfig:
    """How the local engine runs roles.

    Attributes:
        log_dir: directory for one log file per role, or "" for none.
        env: extra environment variables for the roles.
    """

    log_dir: str = ""
    env: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def from_job(cls, job):
        """The config a job's flags ask for: role logs under `--output`/logs."""
        return cls(log_dir=os.path.join(job.output, "logs") if job.output else "")


class LocalInstanceManager(InstanceManager):
    """Runs roles as child processes of the master.

    Args:
        config: a `LocalEngineConfig` (default: no log files, no extra environment).
        on_line: called as `on_line(role_name, line)` for every line a role prints.
    """

    config_type = LocalEngineConfig

    def __init__(self, config=None, on_line=None):
        config = config or LocalEngineConfig()
        self._log_dir = config.log_dir
        self._on_line = on_line or (lambda name, line: None)
        self._env = {**os.environ, "PYTHONUNBUFFERED": "1", **config.env}
        self._procs: dict[str, tuple[RoleSpec, subprocess.Popen, threading.Thread]] = {}
        self._private_dir = None  # the roles' private files (see `RoleSpec.files`)
        self._lock = threading.Lock()
        if self._log_dir:
            os.makedirs(self._log_dir, exist_ok=True)

    def start(self, spec):
        with self._lock:
            if spec.name in self._procs:
                raise ValueError(f"Role {spec.name} is already running.")
            args = self._deliver(spec)
            proc = subprocess.Popen(
                [sys.executable, "-c", CHILD_BOOTSTRAP, str(os.getpid()), spec.module, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self._env,
                start_new_session=True,
            )
            pump = threading.Thread(
                target=self._pump, args=(spec.name, proc), name=f"log-{spec.name}", daemon=True
            )
            pump.start()
            self._procs[spec.name] = (spec, proc, pump)
        logger.info("Started %s (pid %d)", spec.name, proc.pid)

    def _deliver(self, spec):
        """The role's arguments, with its private files written and their flags added."""
        if not spec.files:
            return spec.args
        if self._private_dir is None:
            self._private_dir = tempfile.mkdtemp(prefix="elastic-keras-")  # mode 0700
        args = list(spec.args)
        for flag, data in spec.files:
            path = os.path.join(self._private_dir, f"{spec.name}{flag.replace('-', '_')}")
            write_private(path, data)
            args += [flag, path]
        return tuple(args)

    def _pump(self, name, proc):
        log_file = open_role_log(self._log_dir, name)
        try:
            for raw in proc.stdout:
                line = raw.decode("utf-8", "replace").rstrip("\n")
                if log_file:
                    log_file.write(line + "\n")
                    log_file.flush()
                self._on_line(name, line)
        finally:
            if log_file:
                log_file.close()

    def poll(self):
        exited = []
        with self._lock:
            for name, (spec, proc, pump) in list(self._procs.items()):
                code = proc.poll()
                if code is not None:
                    pump.join(timeout=5)  # let the last lines (a traceback) reach the log
                    del self._procs[name]
                    exited.append(RoleExit(spec, code))
        return exited

    def running(self):
        with self._lock:
            return [spec for spec, proc, _ in self._procs.values() if proc.poll() is None]

    def pid(self, role):
        """The process id of running `role` (a `RoleId`)."""
        with self._lock:
            return self._procs[role.name][1].pid

    def stop(self, role, grace_s):
        with self._lock:
            entry = self._procs.get(role.name)
        if entry:
            self._terminate([entry[1]], grace_s)

    def kill(self, role):
        with self._lock:
            entry = self._procs.get(role.name)
        if entry and entry[1].poll() is None:
            entry[1].kill()

    def stop_all(self, grace_s):
        with self._lock:
            procs = [proc for _, proc, _ in self._procs.values()]
        self._terminate(procs, grace_s)
        self.poll()
        if self._private_dir is not None:
            shutil.rmtree(self._private_dir, ignore_errors=True)
            self._private_dir = None

    @staticmethod
    def _terminate(procs, grace_s):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for proc in procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("Role pid %d ignored SIGTERM for %.0f s; killing it",
                               proc.pid, grace_s)
                proc.kill()
                proc.wait()
