"""The task attempts workers hold now, how far in they are, and how long they may hold them.

Not locked: the `TaskManager` that owns it calls it under its own lock.
"""

import dataclasses
import time

from elastic_keras.master.tasks import Overdue, Task, TaskType


@dataclasses.dataclass
class Running:
    """A task attempt a worker holds."""

    task: Task
    worker_id: int
    started: float  # time.monotonic()
    records_done: int = 0


class RunningTasks:
    """The running attempts by task id, and the slowest completed task of each type."""

    def __init__(self):
        self._by_id: dict[int, Running] = {}
        self.slowest = {}  # TaskType -> seconds, hand-out to result, of the slowest task done

    def __len__(self):
        return len(self._by_id)

    def start(self, task, worker_id):
        self._by_id[task.task_id] = Running(task, worker_id, time.monotonic())

    def get(self, task_id):
        return self._by_id.get(task_id)

    def pop(self, task_id):
        return self._by_id.pop(task_id, None)

    def of_worker(self, worker_id):
        return [r for r in self._by_id.values() if r.worker_id == worker_id]

    def of_type(self, type_=TaskType.TRAINING):
        return [r for r in self._by_id.values() if r.task.type == type_]

    def held(self):
        """`{task_id: a copy of its Running}` (its task, worker, start, records done)."""
        return {task_id: dataclasses.replace(r) for task_id, r in self._by_id.items()}

    def completed(self, running):
        """`running` ended with its task done: it may set the slowest time of its type."""
        took = time.monotonic() - running.started
        self.slowest[running.task.type] = max(self.slowest.get(running.task.type, 0.0), took)

    def overdue(self, floor_s, factor=3.0, now=None):
        """Running tasks held too long: `[Overdue(task_id, worker_id, held_s)]`.

        A task is overdue once it has run longer than `max(floor_s, factor * slowest)`,
        where `slowest` is the longest any completed task of the same type (training or
        evaluation) took, from hand-out to result; before one has completed, `floor_s`
        alone. `floor_s <= 0` disables timeouts (returns []).

        Args:
            floor_s: the shortest time a task may run before it is overdue, in seconds.
            factor: how many times the slowest completed task's time a task may take.
            now: `time.monotonic()` to judge by (None: now).
        """
        if floor_s <= 0:
            return []
        now = time.monotonic() if now is None else now
        return [
            Overdue(task_id, r.worker_id, now - r.started)
            for task_id, r in self._by_id.items()
            if now - r.started > max(floor_s, factor * self.slowest.get(r.task.type, 0.0))
        ]
