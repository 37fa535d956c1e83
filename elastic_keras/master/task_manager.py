"""The task queue: epochs of training tasks, evaluation rounds, retries and coverage.

A task is a range of records of one file. Each epoch's tasks are handed out in a shuffled
order. A task that fails is re-queued, resuming after the last record its worker reported,
up to `max_task_retries` times; one more failure fails the job with that task's error. When
validation data is given, every epoch ends with an evaluation round: training pauses until
every evaluation task is back, so all of them see the same model version.

All methods are thread-safe: the master's gRPC threads and its main loop share one manager.
"""

import dataclasses
import enum
import itertools
import random
import threading
import time

from elastic_keras.master.coverage import Coverage


class TaskType(str, enum.Enum):
    TRAINING = "training"
    EVALUATION = "evaluation"


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

    @property
    def num_records(self):
        return self.end - self.start


@dataclasses.dataclass
class _Running:
    task: Task
    worker_id: int
    started: float
    records_done: int = 0


@dataclasses.dataclass(frozen=True)
class EpochCounts:
    """How many records of one epoch were trained never, once, or more than once."""

    epoch: int
    total: int
    trained_at_least_once: int
    trained_more_than_once: int


class TaskManager:
    """Hands out tasks to workers and keeps track of what was trained.

    Args:
        shards: `[(path, num_records)]` of the training data.
        records_per_task: records in one task.
        num_epochs: passes over the training data.
        max_task_retries: re-queues allowed per task before the job fails.
        eval_shards: `[(path, num_records)]` of the validation data, or empty.
        seed: seed of the per-epoch shuffle (None: random).
    """

    def __init__(self, shards, records_per_task, num_epochs, max_task_retries,
                 eval_shards=(), seed=None):
        self._train_ranges = self._ranges(shards, records_per_task)
        self._eval_ranges = self._ranges(eval_shards, records_per_task)
        self.records_per_epoch = sum(n for _, n in shards)
        self.num_epochs = num_epochs
        self.max_task_retries = max_task_retries
        self._rng = random.Random(seed)
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._todo: list[Task] = []
        self._doing: dict[int, _Running] = {}
        self._coverage = [Coverage() for _ in range(num_epochs)]
        self._epoch_done_records = [0] * num_epochs
        self._eval_round = None  # (epoch, model_version) of the round being evaluated
        self.epoch = -1
        self.tasks_done = 0
        self.tasks_failed = 0
        self.tasks_requeued = 0
        self.error = ""
        self._start_epoch(0)

    @staticmethod
    def _ranges(shards, records_per_task):
        return [
            (path, start, min(start + records_per_task, n))
            for path, n in shards
            for start in range(0, n, records_per_task)
        ]

    def _new_task(self, type_, path, start, end, epoch, retries=0, origin=None, version=0):
        return Task(next(self._ids), type_, path, start, end, epoch, version, retries,
                    origin or (path, start, end))

    def _start_epoch(self, epoch):
        self.epoch = epoch
        order = list(self._train_ranges)
        self._rng.shuffle(order)
        self._todo = [self._new_task(TaskType.TRAINING, *r, epoch) for r in order]

    # -- state -----------------------------------------------------------------------------

    @property
    def finished(self):
        """True when every epoch (and its evaluation) is done, or the job failed."""
        with self._lock:
            return self._finished_locked()

    def _finished_locked(self):
        return bool(self.error) or (
            self.epoch >= self.num_epochs and not self._todo and not self._doing
        )

    @property
    def failed(self):
        return bool(self.error)

    def epoch_counts(self):
        """Per epoch, how many records were trained at least once and more than once."""
        with self._lock:
            result = []
            for epoch, coverage in enumerate(self._coverage):
                once, more = coverage.counts()
                result.append(EpochCounts(epoch, self.records_per_epoch, once, more))
            return result

    def progress(self):
        """(epoch, records of that epoch done, records per epoch), for the progress line."""
        with self._lock:
            epoch = min(self.epoch, self.num_epochs - 1)
            running = sum(
                r.records_done for r in self._doing.values()
                if r.task.type == TaskType.TRAINING and r.task.epoch == epoch
            )
            return epoch, self._epoch_done_records[epoch] + running, self.records_per_epoch

    @property
    def tasks_per_epoch(self):
        return len(self._train_ranges)

    def records_done(self, task_id):
        """How far into running task `task_id` its worker has reported (0 if not running)."""
        with self._lock:
            running = self._doing.get(task_id)
            return running.records_done if running else 0

    def training_load(self):
        """(training tasks waiting, training tasks running)."""
        with self._lock:
            return (sum(t.type == TaskType.TRAINING for t in self._todo),
                    sum(r.task.type == TaskType.TRAINING for r in self._doing.values()))

    def running_tasks(self):
        with self._lock:
            return {task_id: (r.worker_id, r.started) for task_id, r in self._doing.items()}

    # -- handing out -----------------------------------------------------------------------

    def get(self, worker_id):
        """The next task for `worker_id`, or None when there is nothing to do right now."""
        with self._lock:
            if self._finished_locked() or not self._todo:
                return None
            task = self._todo.pop(0)
            self._doing[task.task_id] = _Running(task, worker_id, time.monotonic())
            return task

    def start_evaluation(self, model_version):
        """Queues an evaluation round of the validation data at `model_version`.

        Returns False (and queues nothing) when there is no validation data.
        """
        with self._lock:
            if not self._eval_ranges:
                return False
            epoch = min(self.epoch, self.num_epochs - 1)
            self._eval_round = (epoch, model_version)
            tasks = [
                self._new_task(TaskType.EVALUATION, *r, epoch, version=model_version)
                for r in self._eval_ranges
            ]
            self._todo = tasks + self._todo
            return True

    # -- reports ---------------------------------------------------------------------------

    def report_progress(self, task_id, records_done):
        """Records that the worker on `task_id` is `records_done` records into it."""
        with self._lock:
            running = self._doing.get(task_id)
            if running is None:
                return
            running.records_done = max(running.records_done,
                                       min(records_done, running.task.num_records))
            if running.task.type == TaskType.TRAINING:
                self._coverage[running.task.epoch].add(
                    running.task.path, running.task.task_id, running.task.start,
                    running.task.start + running.records_done,
                )

    def report_result(self, task_id, records_done, error=""):
        """Ends a task. Returns (task, outcome): outcome is "done", "requeued", "failed" or
        "ignored" (a task that is not running, e.g. reported twice or already re-queued).

        When the last training task of an epoch ends, the caller learns of it through
        `epoch_finished()`.
        """
        with self._lock:
            running = self._doing.get(task_id)
            if running is None:
                return None, "ignored"
            if not error:
                records_done = running.task.num_records
            self._doing.pop(task_id)
            task = running.task
            running.records_done = max(running.records_done,
                                       min(records_done, task.num_records))
            if task.type == TaskType.TRAINING:
                self._coverage[task.epoch].add(
                    task.path, task.task_id, task.start, task.start + running.records_done
                )
            if not error:
                self.tasks_done += 1
                if task.type == TaskType.TRAINING:
                    self._epoch_done_records[task.epoch] += task.num_records
                return task, "done"
            self.tasks_failed += 1
            if task.retries >= self.max_task_retries:
                self.error = (
                    f"{task.type.value} task on {task.path} records [{task.start}, {task.end}) "
                    f"failed {task.retries + 1} times; last error: {error}"
                )
                return task, "failed"
            self._requeue(running)
            return task, "requeued"

    def _requeue(self, running):
        task = running.task
        self.tasks_requeued += 1
        resume = task.start + running.records_done
        if task.type == TaskType.TRAINING:
            self._epoch_done_records[task.epoch] += running.records_done
        if resume >= task.end:
            self.tasks_done += 1
            return
        retry = self._new_task(task.type, task.path, resume, task.end, task.epoch,
                               task.retries + 1, task.origin, task.model_version)
        self._todo.insert(0, retry)

    def recover_worker(self, worker_id):
        """Re-queues every task held by `worker_id` (it is gone); returns how many."""
        with self._lock:
            lost = [r for r in self._doing.values() if r.worker_id == worker_id]
            for running in lost:
                del self._doing[running.task.task_id]
                self._requeue(running)
            return len(lost)

    def epoch_finished(self):
        """If the current epoch's training is all done, closes it and returns its number.

        The caller then starts an evaluation round (or not) and calls `next_epoch()`.
        Returns None while the epoch is still running.
        """
        with self._lock:
            if self.epoch >= self.num_epochs or self._eval_round is not None:
                return None
            busy = self._todo or any(
                r.task.type == TaskType.TRAINING for r in self._doing.values()
            )
            return None if busy else self.epoch

    def evaluation_finished(self):
        """(epoch, model_version) of the round that just ended, else None."""
        with self._lock:
            if self._eval_round is None:
                return None
            if any(t.type == TaskType.EVALUATION for t in self._todo) or any(
                r.task.type == TaskType.EVALUATION for r in self._doing.values()
            ):
                return None
            finished, self._eval_round = self._eval_round, None
            return finished

    def next_epoch(self):
        """Starts the next epoch's training, or ends the job after the last one."""
        with self._lock:
            if self.epoch + 1 < self.num_epochs:
                self._start_epoch(self.epoch + 1)
            else:
                self.epoch = self.num_epochs
