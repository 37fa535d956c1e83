"""The task data types: what a task is, how one ended, and the counts the master reports.

A task is a range of records of one file, [start, end), in one epoch. Each attempt at a range
is a `Task` of its own id; a re-queued task carries on its first attempt's `origin`.
"""

import dataclasses
import enum
from typing import NamedTuple


class TaskType(str, enum.Enum):
    TRAINING = "training"
    EVALUATION = "evaluation"
    PREDICTION = "prediction"


class TaskOutcome(str, enum.Enum):
    """How `TaskManager.report_result` ended a task."""

    DONE = "done"
    REQUEUED = "requeued"  # the rest of its range, if any, is back in the queue
    FAILED = "failed"  # out of retries: the job fails
    IGNORED = "ignored"  # the task was not running (reported twice, or already re-queued)


@dataclasses.dataclass
class Task:
    """One attempt at a range of records: [start, end) of `path`."""

    task_id: int
    type: TaskType
    path: str
    start: int
    end: int
    epoch: int
    model_version: int = 0
    retries: int = 0
    origin: "tuple[str, int, int]" = ()  # (path, start, end) of the task's first attempt
    takes_over: bool = False  # it carries on the attempt of a worker that left or hung

    @property
    def num_records(self):
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class EpochCounts:
    """How many records of one epoch were trained never, once, or more than once, and the
    seconds from its first training task handed out to its last one done in this run (None
    when it was not all trained in this run).

    `tasks_lost` counts the epoch's training tasks taken from a worker that died or timed
    out: each may have trained records past its last progress report, which are trained
    again and which no report counts (see `TaskManager.recover_worker`).
    """

    epoch: int
    total: int
    trained_at_least_once: int
    trained_more_than_once: int
    training_s: "float | None" = None
    tasks_lost: int = 0


class EvalRound(NamedTuple):
    """An evaluation round of `epoch` at `model_version`; `end_of_epoch` when the epoch's
    training was complete when it ran (the master then calls `next_epoch()`)."""

    epoch: int
    model_version: int
    end_of_epoch: bool


class Overdue(NamedTuple):
    """A running task held past its timeout (see `TaskManager.overdue`)."""

    task_id: int
    worker_id: int
    held_s: float  # how long its worker has held it
