"""The launcher interface: engines start, watch and stop roles; the master holds the policy."""

import abc
import dataclasses
import enum


class RoleType(str, enum.Enum):
    PS = "ps"
    WORKER = "worker"


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """What to run: `python -m <module> <args...>` as role `type` number `index`."""

    type: RoleType
    index: int
    module: str
    args: tuple

    @property
    def name(self):
        return f"{self.type.value}-{self.index}"


@dataclasses.dataclass(frozen=True)
class RoleExit:
    """A role that stopped: its spec and exit code (negative: killed by that signal)."""

    spec: RoleSpec
    exit_code: int

    @property
    def succeeded(self):
        return self.exit_code == 0


class InstanceManager(abc.ABC):
    """Starts, watches and stops the processes of a job's roles.

    Implementations only carry out orders; deciding to relaunch, re-queue or give up is the
    master's job.
    """

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
    def stop(self, name: str, grace_s: float) -> None:
        """Stops role `name`: SIGTERM, then SIGKILL after `grace_s` seconds."""

    @abc.abstractmethod
    def kill(self, name: str) -> None:
        """Kills role `name` at once (SIGKILL) without waiting; `poll` reports its exit."""

    @abc.abstractmethod
    def stop_all(self, grace_s: float) -> None:
        """Stops every role; returns when none is left."""
