"""The launcher interface: engines start, watch and stop roles; the master holds the policy.

An engine is an `InstanceManager` subclass built from its own frozen config
(`config_type.from_job(job_config)`), registered by name in `instance_manager.ENGINES` and
chosen with `--engine`. Roles are addressed by `RoleId`; what ended a role comes back as a
`RoleExit` with an `ExitReason`.
"""

import abc
import dataclasses
import enum
import signal

from elastic_keras.common.exit_codes import RoleExitCode


class RoleType(str, enum.Enum):
    PS = "ps"
    WORKER = "worker"


@dataclasses.dataclass(frozen=True, order=True)
class RoleId:
    """One role of a job: parameter server or worker number `index`."""

    type: RoleType
    index: int

    @property
    def name(self):
        return f"{self.type.value}-{self.index}"

    def __str__(self):
        return self.name


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """What to run: `python -m <module> <args...>` as role `role`.

    `files` are `(flag, bytes)` pairs: private files the role reads at start (its
    credentials). The engine delivers each where only the role's user can read it (a file
    of mode 0600 locally, a Secret on Kubernetes) and adds `flag PATH` to the command line;
    their content never appears on a command line.

    `advertise_flag`, for a role that serves (a parameter server: `--advertise-host`), is the
    flag that tells it the address other roles reach it at; an engine that knows that address
    (the pod's IP on Kubernetes, the node's on Ray) adds `advertise_flag ADDRESS`.
    """

    role: RoleId
    module: str
    args: tuple
    files: tuple = ()
    advertise_flag: str = ""

    @property
    def name(self):
        return self.role.name


class ExitReason(str, enum.Enum):
    """Why a role stopped, from its exit code (see `common.exit_codes.RoleExitCode`)."""

    SUCCEEDED = "succeeded"
    CRASHED = "crashed"            # an exit code of its own making: an error
    KILLED = "killed"              # a signal
    MASTER_LOST = "master_lost"
    BAD_INPUT = "bad_input"
    LEAVE_TIMEOUT = "leave_timeout"
    # Told by an engine that sees more than an exit code (Kubernetes, Ray):
    OOM_KILLED = "oom_killed"        # over its memory limit
    PREEMPTED = "preempted"          # preempted or evicted by the cluster
    DELETED = "deleted"              # its pod deleted by someone else
    UNSCHEDULABLE = "unschedulable"  # never started within --pending-timeout
    ACTOR_LOST = "actor_lost"        # its Ray actor killed, or its node lost

    @classmethod
    def of(cls, exit_code):
        if exit_code < 0:
            return cls.KILLED
        named = {RoleExitCode.OK: cls.SUCCEEDED, RoleExitCode.MASTER_LOST: cls.MASTER_LOST,
                 RoleExitCode.BAD_INPUT: cls.BAD_INPUT,
                 RoleExitCode.LEAVE_TIMEOUT: cls.LEAVE_TIMEOUT}
        return named.get(exit_code, cls.CRASHED)


_TOLD = {ExitReason.OOM_KILLED: "was OOMKilled (over its memory limit)",
         ExitReason.PREEMPTED: "was preempted or evicted by the cluster",
         ExitReason.DELETED: "had its pod deleted",
         ExitReason.UNSCHEDULABLE: "was not scheduled within --pending-timeout",
         ExitReason.ACTOR_LOST: "lost its Ray actor (killed, or its node lost)"}


@dataclasses.dataclass(frozen=True)
class RoleExit:
    """A role that stopped: its spec and exit code (negative: killed by that signal), and
    the reason an engine saw when the code alone does not tell it (`told`)."""

    spec: RoleSpec
    exit_code: int
    told: "ExitReason | None" = None
    detail: str = ""  # what the engine saw, e.g. the scheduler's message

    @property
    def role(self):
        return self.spec.role

    @property
    def reason(self):
        return self.told or ExitReason.of(self.exit_code)

    @property
    def succeeded(self):
        return self.exit_code == 0

    def describe(self):
        """"exited with code 3", "was killed by SIGKILL", ..., for log lines."""
        if self.told in _TOLD:
            return _TOLD[self.told] + (f": {self.detail}" if self.detail else "")
        if self.exit_code < 0:
            try:
                return f"was killed by {signal.Signals(-self.exit_code).name}"
            except ValueError:
                return f"was killed by signal {-self.exit_code}"
        named = self.reason not in (ExitReason.SUCCEEDED, ExitReason.CRASHED)
        return f"exited with code {self.exit_code}" + (f" ({self.reason.value})" if named else "")

    def to_json(self):
        return {"role": self.role.name, "exit_code": self.exit_code,
                "reason": self.reason.value}


class InstanceManager(abc.ABC):
    """Starts, watches and stops the processes of a job's roles.

    Implementations only carry out orders; deciding to relaunch, re-queue or give up is the
    master's job. Each is built as `Engine(config, on_line)` from an instance of its
    `config_type`, a frozen dataclass with a `from_job(job_config)` class method.
    """

    config_type: type

    @abc.abstractmethod
    def start(self, spec: RoleSpec) -> None:
        """Starts the role described by `spec`."""

    @abc.abstractmethod
    def poll(self) -> "list[RoleExit]":
        """The roles that have exited since the last call."""

    @abc.abstractmethod
    def running(self) -> "list[RoleSpec]":
        """The roles still running."""

    @abc.abstractmethod
    def stop(self, role: RoleId, grace_s: float) -> None:
        """Stops `role`: SIGTERM, then SIGKILL after `grace_s` seconds."""

    @abc.abstractmethod
    def kill(self, role: RoleId) -> None:
        """Kills `role` at once (SIGKILL) without waiting; `poll` reports its exit."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float) -> None:
        """Stops every role; returns when none is left."""
