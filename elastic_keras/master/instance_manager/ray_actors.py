"""Roles as Ray actors: `--engine ray`.

Each launch of a role is an actor (a `PSActor` or a `WorkerActor`) named `<role>-<launch>` in
the Ray namespace `elastic-keras-<job>`, placed by Ray with the resources
`--ps-resource-request` and `--worker-resource-request` ask for (none by default, so a role
never waits for a CPU Ray counts as taken). The actor runs the role as its child process, as
the local engine does, and the child asks for SIGKILL when the actor dies. Ray restarts no
actor and retries no call: relaunching is the master's decision. Private data reaches the child through its
environment (`env:NAME` sources, see `common.private_data`), never a file or a command line.
A serving role advertises its node's address.

One thread polls every running actor: the role's output comes back with each poll, into the
master's console and `<output>/logs/<role>.log`. What ended a launch is told apart: the
child's exit code or signal, its actor lost (`ray.kill`, its node died, the job's own cluster
stopped), or its actor not placed and started within `--pending-timeout`.

Without `--ray-address` the engine starts a Ray cluster on this machine for the job
(`ray_cluster`) and stops it with the job; with one, it connects to that cluster and leaves it
running.
"""

import collections
import dataclasses
import logging
import os
import signal
import subprocess
import sys
import threading
import time

from elastic_keras.common.engine_options import ClusterOptions, parse_pairs, quantity
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.private_data import encode_for_env, env_name, env_source
from elastic_keras.master.instance_manager.api import ExitReason, RoleExit, RoleType
from elastic_keras.master.instance_manager.local import CHILD_BOOTSTRAP, open_role_log
from elastic_keras.master.instance_manager.ray_cluster import (
    check_host_reaches_nodes, connect,
)
from elastic_keras.master.instance_manager.watched import WatchedInstanceManager

logger = logging.getLogger(__name__)

POLL_S = 0.25        # how often every actor is asked for its role's output and exit
MAX_LINES = 2000     # output lines one poll brings back at most
STOP_WAIT_S = 30.0   # after a stop's grace, how long its role gets to be seen gone
NAME_TRIES = 100     # launch numbers tried for a free actor name


@dataclasses.dataclass(frozen=True)
class RayEngineConfig:
    """How the Ray engine runs a job's roles.

    Attributes:
        job_name: names the actors' namespace.
        options: the job's `ClusterOptions` (--ray-address, resources, env, ...).
        log_dir: where role logs go, or "" for none.
        workdir: the roles' working directory, on the nodes where it exists.
        host: the job's `--host`, which every role binds.
    """

    job_name: str = "job"
    options: ClusterOptions = ClusterOptions()
    log_dir: str = ""
    workdir: str = ""
    host: str = "127.0.0.1"

    @classmethod
    def from_job(cls, job):
        return cls(job.job_name, job.cluster,
                   os.path.join(job.output, "logs") if job.output else "", os.getcwd(),
                   job.host)


def actor_options(options, role_type):
    """Ray's placement options for a role of `role_type`, from its resource requests.

    Raises:
        ConfigError: a resource Ray does not schedule.
    """
    role = role_type.value
    flag = f"--{role}-resource-request"
    placed = {"num_cpus": 0}
    for name, value in options.role_resources(role).items():
        amount = quantity(value, f"{flag} {name}")
        if name == "cpu":
            placed["num_cpus"] = amount
        elif name == "gpu":
            placed["num_gpus"] = amount
        elif name == "memory":
            placed["memory"] = int(amount)
        else:
            raise ConfigError(f"{flag}: Ray schedules cpu, gpu and memory. "
                              f"Received: {name}={value}")
    return placed


class RoleActor:
    """One launch of a role, run as this actor's child process."""

    def __init__(self):
        self._proc = None
        self._lines = collections.deque()
        self._reader = None

    def start(self, module, args, private, advertise_flag, env, workdir):
        """Starts the role; returns (this node's address, the role's pid)."""
        import ray
        node = ray.util.get_node_ip_address()
        args, child_env = list(args), {**os.environ, "PYTHONUNBUFFERED": "1", **env}
        for flag, data in private:
            name = env_name(flag)
            child_env[name] = encode_for_env(data)
            args += [flag, env_source(name)]
        if advertise_flag:
            args += [advertise_flag, node]
        self._proc = subprocess.Popen(
            [sys.executable, "-c", CHILD_BOOTSTRAP, str(os.getpid()), module, *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=child_env, cwd=workdir if workdir and os.path.isdir(workdir) else None,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return node, self._proc.pid

    def _read(self):
        for raw in self._proc.stdout:
            self._lines.append(raw.decode("utf-8", "replace").rstrip("\n"))

    def poll(self, max_lines):
        """(exit code or None while running or output is left, output lines since the last
        poll)."""
        code = self._proc.poll()
        if code is not None:
            self._reader.join(timeout=5)
        lines = [self._lines.popleft() for _ in range(min(max_lines, len(self._lines)))]
        return (None if self._lines else code), lines

    def signal(self, signum):
        if self._proc.poll() is None:
            self._proc.send_signal(signum)


class PSActor(RoleActor):
    """A parameter server's launch (the class name is what Ray's tools show)."""


class WorkerActor(RoleActor):
    """A worker's launch."""


@dataclasses.dataclass
class _Launch:
    spec: object
    actor: object
    created: float
    started: object = None  # the start call's ref until it answers, then None
    stopping: bool = False
    polling: object = None  # the poll call in flight
    ended: "RoleExit | None" = None


class RayInstanceManager(WatchedInstanceManager):
    """Runs each role as a Ray actor.

    Args:
        config: a `RayEngineConfig`.
        on_line: called as `on_line(role_name, line)` for every line a role prints.

    Raises:
        ConfigError: Ray is not installed, the cluster cannot be reached or started, or bad
            resource flags.
    """

    config_type = RayEngineConfig

    def __init__(self, config=None, on_line=None):
        super().__init__()
        config = config or RayEngineConfig()
        self._config = config
        self._placement = {t: actor_options(config.options, t) for t in RoleType}
        self._env = parse_pairs(config.options.env, "--env")
        self._on_line = on_line or (lambda name, line: None)
        self._ray, self._cluster = connect(config.options.ray_address,
                                           f"elastic-keras-{config.job_name}", config.log_dir)
        remote = self._ray.remote(max_restarts=0, max_task_retries=0)
        self._actor_types = {RoleType.PS: remote(PSActor), RoleType.WORKER: remote(WorkerActor)}
        try:
            check_host_reaches_nodes(config.host, self._ray.nodes(),
                                     self._ray.util.get_node_ip_address())
            for role_type, actor_type in self._actor_types.items():
                try:
                    actor_type.options(**self._placement[role_type])
                except ValueError as exc:
                    raise ConfigError(f"--{role_type.value}-resource-request: Ray refuses "
                                      f"{self._placement[role_type]}: {exc}") from None
        except ConfigError:
            self._disconnect()
            raise
        self._launches = collections.Counter()
        self._logs = {}
        self._closed = threading.Event()
        self._watcher = threading.Thread(target=self._watch, name="ray-watch", daemon=True)
        self._watcher.start()

    # -- orders ----------------------------------------------------------------------------

    def start(self, spec):
        with self._lock:
            if spec.name in self._current:
                raise ValueError(f"Role {spec.name} is already running.")
        if self._cluster is not None and not self._cluster.alive():
            raise RuntimeError(f"Cannot start {spec.name}: the job's Ray cluster stopped "
                               f"(see {self._cluster.log_path})")
        actor, name = self._create(spec)
        started = actor.start.remote(spec.module, spec.args, spec.files, spec.advertise_flag,
                                     self._env, self._config.workdir)
        with self._lock:
            self._current[spec.name] = _Launch(spec, actor, time.monotonic(), started)
        logger.info("Created Ray actor %s for %s", name, spec.name)

    def _create(self, spec):
        """(a new actor for `spec`, its name): the next launch number whose name is free (an
        earlier run of the job, on a cluster that outlives it, may still hold some)."""
        options = self._placement[spec.role.type]
        for _ in range(NAME_TRIES):
            with self._lock:
                launch = self._launches[spec.name]
                self._launches[spec.name] += 1
            name = f"{spec.name}-{launch}"
            try:
                return self._actor_types[spec.role.type].options(
                    name=name, **options).remote(), name
            except self._ray.exceptions.ActorAlreadyExistsError as exc:
                taken = exc
        raise RuntimeError(f"Cannot create a Ray actor for {spec.name}: {NAME_TRIES} names "
                           f"in a row were taken, the last {name}: {taken}")

    def stop(self, role, grace_s):
        self._stop([role.name], grace_s)

    def kill(self, role):
        for launch in self._claim([role.name]):
            self._signal(launch, signal.SIGKILL)

    def stop_all(self, grace_s):
        with self._lock:
            names = list(self._current)
        self._stop(names, grace_s)
        self._closed.set()
        self._watcher.join(timeout=10)
        if not self._watcher.is_alive():  # else it may still write; the files close with it
            for log in filter(None, self._logs.values()):
                log.close()
            self._logs.clear()
        self._disconnect()

    def _disconnect(self):
        self._ray.shutdown()
        if self._cluster is not None:
            self._cluster.stop()

    def _stop(self, names, grace_s):
        """SIGTERM to the roles `names`, SIGKILL after `grace_s`; returns once each is seen
        ended (its actor killed, and the role taken as killed, if it is never seen)."""
        launches = self._claim(names)
        for signum, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, STOP_WAIT_S)):
            for launch in launches:
                self._signal(launch, signum)
            if self._wait_ended(launches, wait_s):
                return
        with self._lock:
            unseen = [launch for launch in launches if launch.ended is None]
            for launch in unseen:
                self._end(launch, RoleExit(launch.spec, -signal.SIGKILL))
        for launch in unseen:
            self._ray.kill(launch.actor)

    def _signal(self, launch, signum):
        if launch.started is not None and signum == signal.SIGKILL:
            self._ray.kill(launch.actor)  # not placed yet: nothing runs to signal
        else:
            launch.actor.signal.remote(signum)

    # -- what the actors say -----------------------------------------------------------------

    def _watch(self):
        while not self._closed.wait(POLL_S):
            try:
                self._poll_actors()
            except Exception:  # never leave the job without a watch
                logger.exception("Polling the job's Ray actors failed; polling again")

    def _poll_actors(self):
        if self._cluster is not None and not self._cluster.alive():
            self._cluster_lost()
            return
        with self._lock:
            launches = [l for l in self._current.values() if l.ended is None]
        for launch in launches:
            if launch.started is not None:
                self._check_started(launch)
            elif launch.polling is None:
                launch.polling = launch.actor.poll.remote(MAX_LINES)
        polls = {l.polling: l for l in launches if l.polling is not None}
        if polls:
            ready, _ = self._ray.wait(list(polls), num_returns=len(polls), timeout=1.0)
            for ref in ready:
                polls[ref].polling = None
                self._polled(polls[ref], ref)

    def _cluster_lost(self):
        """The job's own cluster stopped under it: every role is gone with it."""
        with self._lock:
            if not self._current:
                return
            logger.error("The job's Ray cluster stopped (see %s)", self._cluster.log_path)
            for launch in list(self._current.values()):
                self._end(launch, RoleExit(launch.spec, -signal.SIGKILL, ExitReason.ACTOR_LOST,
                                           "the job's Ray cluster stopped"))

    def _check_started(self, launch):
        ready, _ = self._ray.wait([launch.started], timeout=0)
        if ready:
            try:
                node, pid = self._ray.get(launch.started)
            except self._ray.exceptions.ActorUnavailableError:
                return  # for now: its node is unreachable; asked again next round
            except self._ray.exceptions.RayError as exc:
                self._lost(launch, exc)
                return
            launch.started = None
            logger.info("%s runs on %s (pid %d)", launch.spec.name, node, pid)
            return
        timeout = self._config.options.pending_timeout
        with self._lock:
            late = (timeout and not launch.stopping
                    and time.monotonic() - launch.created > timeout)
            if late:
                launch.stopping = True
                wanted = ", ".join(f"{k}={v}" for k, v in
                                   self._placement[launch.spec.role.type].items())
                self._end(launch, RoleExit(
                    launch.spec, -signal.SIGKILL, ExitReason.UNSCHEDULABLE,
                    f"not placed and started within {timeout:.0f} s (it asks for {wanted})"))
        if late:
            self._ray.kill(launch.actor)

    def _polled(self, launch, ref):
        exceptions = self._ray.exceptions
        try:
            code, lines = self._ray.get(ref)
        except exceptions.ActorUnavailableError:
            return  # for now: its node is unreachable; asked again next round
        except exceptions.RayError as exc:
            self._lost(launch, exc)
            return
        for line in lines:
            self._line(launch.spec.name, line)
        if code is not None:
            with self._lock:
                self._end(launch, RoleExit(launch.spec, code))
            self._ray.kill(launch.actor)

    def _lost(self, launch, exc):
        """The actor of `launch` is gone (or its start failed)."""
        actor_died = isinstance(exc, self._ray.exceptions.RayActorError)
        with self._lock:
            if launch.stopping:
                ended = RoleExit(launch.spec, -signal.SIGKILL)
            elif actor_died:
                ended = RoleExit(launch.spec, -signal.SIGKILL, ExitReason.ACTOR_LOST,
                                 _cause(exc))
            else:  # its start raised
                ended = RoleExit(launch.spec, 1, None, _cause(exc))
                logger.error("%s could not start in its Ray actor: %s", launch.spec.name, exc)
            self._end(launch, ended)
        self._ray.kill(launch.actor)  # harmless when it is dead; stops one that is not

    def _line(self, name, line):
        if name not in self._logs:
            self._logs[name] = open_role_log(self._config.log_dir, name)
        if self._logs[name]:
            self._logs[name].write(line + "\n")
            self._logs[name].flush()
        self._on_line(name, line)


def _cause(exc):
    """The line of a Ray error that says why (Ray puts it after the actor's details)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    because = [line for line in lines if "because" in line]
    return (because or lines or [type(exc).__name__])[-1][:200]
