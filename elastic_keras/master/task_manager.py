"""The task queue: epochs of training tasks, evaluation rounds, re-queues, timeouts, coverage.

A task is a range of records of one file. Each epoch's tasks are handed out in a shuffled
order.

Re-queues. A task goes back to the front of the queue, resuming after the last record its
worker reported (an evaluation task starts over: its metrics come only with its result):

- its worker reports an error: a retry. A task may be retried `max_task_retries` times; one
  more error fails the job with that task's error;
- its worker is lost (`recover_worker`), hands it back (`report_result(abandoned=True)`) or
  holds it too long (`overdue`, `requeue_overdue`). None of these is the task's fault, so no
  retry is counted.

Evaluation rounds. `start_evaluation` opens a round over the validation data, at the end of
an epoch or mid-epoch. While it is open no training task is handed out, and its evaluation
tasks are handed out only once no training task runs: with asynchronous training too, every
evaluation task sees the same model. `get()` returns None meanwhile (the worker waits).

Persistence. `state()` is a JSON-serialisable snapshot; `TaskManager.from_state` rebuilds a
manager that carries on from it after a restart of the master.

All methods are thread-safe: the master's gRPC threads and its main loop share one manager.

Example:
    tasks = TaskManager([("train-0.tfrecord", 1000)], records_per_task=100, num_epochs=2,
                        max_task_retries=3, eval_shards=[("test-0.tfrecord", 200)])
    task = tasks.get(worker_id=0)
    tasks.report_progress(task.task_id, 50)
    tasks.report_result(task.task_id, 100)
"""

import collections
import dataclasses
import enum
import random
import threading
import time
from typing import NamedTuple

from elastic_keras.master.coverage import Coverage

STATE_FORMAT = 1


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
    takes_over: bool = False  # it carries on the attempt of a worker that left or hung

    @property
    def num_records(self):
        return self.end - self.start


@dataclasses.dataclass
class _Running:
    task: Task
    worker_id: int
    started: float  # time.monotonic()
    records_done: int = 0


@dataclasses.dataclass(frozen=True)
class EpochCounts:
    """How many records of one epoch were trained never, once, or more than once, and the
    seconds from its first training task handed out to its last one done in this run (None
    when it was not all trained in this run).

    `tasks_lost` counts the epoch's training tasks taken from a worker that died or timed
    out: each may have trained records past its last progress report, which are trained
    again and which no report counts (see `recover_worker`).
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


class TaskManager:
    """Hands out tasks to workers and keeps track of what was trained.

    Args:
        shards: `[(path, num_records)]` of the training data.
        records_per_task: records in one task.
        num_epochs: passes over the training data.
        max_task_retries: retries (re-queues after an error) allowed per task before the job
            fails.
        eval_shards: `[(path, num_records)]` of the validation data, or empty.
        seed: seed of the per-epoch shuffle (None: random).
    """

    def __init__(self, shards, records_per_task, num_epochs, max_task_retries,
                 eval_shards=(), seed=None):
        self._shards = [(str(path), int(n)) for path, n in shards]
        self.records_per_task = records_per_task
        self._train_ranges = self._ranges(self._shards, records_per_task)
        self._eval_ranges = self._ranges(eval_shards, records_per_task)
        self.records_per_epoch = sum(n for _, n in self._shards)
        self.num_epochs = num_epochs
        self.max_task_retries = max_task_retries
        self._rng = random.Random(seed)
        self._last_id = 0
        self._lock = threading.Lock()
        self._todo: list[Task] = []       # training tasks of the current epoch
        self._eval_todo: list[Task] = []  # evaluation tasks of the open round
        self._doing: dict[int, _Running] = {}
        self._coverage = [Coverage() for _ in range(num_epochs)]
        self._epoch_done_records = [0] * num_epochs
        self._round = None  # the open EvalRound
        self._epoch_evaluated = False  # an end-of-epoch round ended; next_epoch() is due
        self._slowest = {}  # TaskType -> seconds of the slowest completed task
        self._epoch_span = {}  # epoch -> [first training task handed out, training done]
        self._lost = collections.Counter()  # epoch -> training tasks lost with their worker
        self.epoch = -1
        self.tasks_done = 0
        self.tasks_failed = 0
        self.tasks_requeued = 0     # every re-queue, whatever the reason
        self.tasks_handed_back = 0  # re-queues asked for by the worker (abandoned=True)
        self.tasks_timed_out = 0    # re-queues by `requeue_overdue`
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
        self._last_id += 1
        return Task(self._last_id, type_, path, start, end, epoch, version, retries,
                    tuple(origin or (path, start, end)))

    def _start_epoch(self, epoch):
        self.epoch = epoch
        self._epoch_evaluated = False
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
            self.epoch >= self.num_epochs
            and not self._todo and not self._eval_todo and not self._doing
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
                span = self._epoch_span.get(epoch, [None, None])
                seconds = None if None in span else round(span[1] - span[0], 3)
                result.append(EpochCounts(epoch, self.records_per_epoch, once, more, seconds,
                                          self._lost[epoch]))
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
        """(training tasks that `get()` may hand out now, training tasks running).

        While an evaluation round is open no training task is handed out, so the first
        number is 0 then: the running tasks are all that will push gradients until it ends.
        """
        with self._lock:
            waiting = 0 if self._round is not None else len(self._todo)
            return waiting, self._training_running_locked()

    def training_running(self):
        """How many training tasks are running."""
        with self._lock:
            return self._training_running_locked()

    def _training_running_locked(self):
        return sum(r.task.type == TaskType.TRAINING for r in self._doing.values())

    def _training_complete_locked(self):
        return not self._todo and not self._training_running_locked()

    def running_tasks(self):
        with self._lock:
            return {task_id: (r.worker_id, r.started) for task_id, r in self._doing.items()}

    def training_workers(self):
        """Ids of the workers running a training task now."""
        with self._lock:
            return {r.worker_id for r in self._doing.values()
                    if r.task.type == TaskType.TRAINING}

    # -- handing out -----------------------------------------------------------------------

    def get(self, worker_id):
        """The next task for `worker_id`, or None when there is nothing to do right now."""
        with self._lock:
            if self._finished_locked():
                return None
            if self._round is not None:
                if self._training_running_locked() or not self._eval_todo:
                    return None  # the round's barrier: no training, then all evaluation
                task = self._eval_todo.pop(0)
            elif self._todo:
                task = self._todo.pop(0)
                if task.epoch not in self._epoch_span:
                    self._epoch_span[task.epoch] = [time.monotonic(), None]
            else:
                return None
            self._doing[task.task_id] = _Running(task, worker_id, time.monotonic())
            return task

    def start_evaluation(self, model_version, end_of_epoch=True):
        """Opens an evaluation round of the validation data at `model_version`.

        Training tasks already running finish; then every evaluation task is handed out,
        and training resumes once they are all back (see `evaluation_finished`).

        Args:
            model_version: the model version the round is for.
            end_of_epoch: True for the round that closes the epoch (after `epoch_finished()`
                returned it), False for a round in the middle of an epoch.

        Returns:
            False, queuing nothing, when there is no validation data, when the job is over,
            when the epoch's end-of-epoch round has ended (`next_epoch()` is due), or, for a
            mid-epoch round, when a round is already open. True otherwise; when
            `end_of_epoch` and a round is already open, that round closes the epoch.

        Raises:
            ValueError: `end_of_epoch` is True while the epoch still has training to do.
        """
        with self._lock:
            if (not self._eval_ranges or self._finished_locked()
                    or self.epoch >= self.num_epochs or self._epoch_evaluated):
                return False
            if end_of_epoch and not self._training_complete_locked():
                raise ValueError(
                    f"end_of_epoch=True needs epoch {self.epoch}'s training to be complete; "
                    f"Received: end_of_epoch=True with {len(self._todo)} training tasks "
                    f"waiting and {self._training_running_locked()} running"
                )
            if self._round is not None:
                if end_of_epoch:
                    self._round = self._round._replace(end_of_epoch=True)
                return end_of_epoch
            self._round = EvalRound(self.epoch, model_version, end_of_epoch)
            self._eval_todo = [
                self._new_task(TaskType.EVALUATION, *r, self.epoch, version=model_version)
                for r in self._eval_ranges
            ]
            return True

    # -- reports ---------------------------------------------------------------------------

    def report_progress(self, task_id, records_done):
        """Records that the worker on `task_id` is `records_done` records into it."""
        with self._lock:
            running = self._doing.get(task_id)
            if running is not None:
                self._advance(running, records_done)

    def _advance(self, running, records_done):
        task = running.task
        running.records_done = max(running.records_done, min(records_done, task.num_records))
        if task.type == TaskType.TRAINING:
            self._coverage[task.epoch].add(
                task.path, task.task_id, task.start, task.start + running.records_done
            )

    def report_result(self, task_id, records_done, error="", abandoned=False):
        """Ends a task.

        Args:
            task_id: the task.
            records_done: records of it the worker got through.
            error: why it failed; empty when it succeeded.
            abandoned: the worker hands the task back (it is being preempted): the rest of
                it is re-queued, counting neither a retry nor a failure.

        Returns:
            (task, outcome): outcome is "done", "requeued" (the rest of its range, if any,
            is back in the queue), "failed" (the job fails) or "ignored" (with task None:
            a task that is not running, e.g. reported twice or already re-queued).

        When the last training task of an epoch ends, the caller learns of it through
        `epoch_finished()`.
        """
        with self._lock:
            running = self._doing.pop(task_id, None)
            if running is None:
                return None, "ignored"
            task = running.task
            succeeded = not error and not abandoned
            self._advance(running, task.num_records if succeeded else records_done)
            if abandoned:
                self.tasks_handed_back += 1
                self._requeue(running, retry=False)
                return task, "requeued"
            if succeeded:
                self.tasks_done += 1
                if task.type == TaskType.TRAINING:
                    self._epoch_done_records[task.epoch] += task.num_records
                    if task.epoch == self.epoch and self._training_complete_locked():
                        self._epoch_span[task.epoch][1] = time.monotonic()
                took = time.monotonic() - running.started
                self._slowest[task.type] = max(self._slowest.get(task.type, 0.0), took)
                return task, "done"
            self.tasks_failed += 1
            if task.retries >= self.max_task_retries:
                self.error = (
                    f"{task.type.value} task on {task.path} records [{task.start}, {task.end}) "
                    f"failed {task.retries + 1} times; last error: {error}"
                )
                return task, "failed"
            self._requeue(running, retry=True)
            return task, "requeued"

    def _requeue(self, running, retry):
        task = running.task
        self.tasks_requeued += 1
        if task.type == TaskType.EVALUATION:
            resume = task.start  # its metric states come only with a successful result
        else:
            resume = task.start + running.records_done
            self._epoch_done_records[task.epoch] += running.records_done
        if resume >= task.end:
            self.tasks_done += 1
            return
        again = self._new_task(task.type, task.path, resume, task.end, task.epoch,
                               task.retries + int(retry), task.origin, task.model_version)
        again.takes_over = not retry
        (self._todo if task.type == TaskType.TRAINING else self._eval_todo).insert(0, again)

    def recover_worker(self, worker_id):
        """Re-queues every task held by `worker_id` (it is gone), counting no retry; returns
        how many.

        Each resumes after the last record its worker reported; what the worker trained
        after that report is trained again, unseen (counted in `EpochCounts.tasks_lost`).
        """
        with self._lock:
            lost = [r for r in self._doing.values() if r.worker_id == worker_id]
            for running in lost:
                del self._doing[running.task.task_id]
                self._lose(running)
            return len(lost)

    def _lose(self, running):
        if running.task.type == TaskType.TRAINING:
            self._lost[running.task.epoch] += 1
        self._requeue(running, retry=False)

    # -- timeouts --------------------------------------------------------------------------

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
        with self._lock:
            return [
                Overdue(task_id, r.worker_id, now - r.started)
                for task_id, r in self._doing.items()
                if now - r.started > max(floor_s, factor * self._slowest.get(r.task.type, 0.0))
            ]

    def requeue_overdue(self, task_id):
        """Re-queues running task `task_id` (see `overdue`) like a lost worker's, counting
        no retry; returns the worker that held it, or None if it is no longer running.

        The worker's later reports for it are ignored; records it trains after its last
        report are trained again by the re-queued task.
        """
        with self._lock:
            running = self._doing.pop(task_id, None)
            if running is None:
                return None
            self.tasks_timed_out += 1
            self._lose(running)
            return running.worker_id

    # -- epochs and rounds -----------------------------------------------------------------

    def epoch_finished(self):
        """The current epoch's number once its training is all done, else None.

        The caller then starts an end-of-epoch evaluation round (or not) and calls
        `next_epoch()`. None while an evaluation round is open (if the epoch's training
        completes meanwhile, that round closes the epoch: see `evaluation_finished`) and
        after the epoch's end-of-epoch round, until `next_epoch()`.
        """
        with self._lock:
            if (self.error or self.epoch >= self.num_epochs or self._round is not None
                    or self._epoch_evaluated):
                return None
            return self.epoch if self._training_complete_locked() else None

    def evaluation_finished(self):
        """The `EvalRound` that just ended (once), else None.

        A round reports `end_of_epoch=True` when it was started so, or when the epoch's
        training was complete by the time it ran (then it evaluated the end-of-epoch
        model, and no second round is needed): the caller then calls `next_epoch()`.
        """
        with self._lock:
            if self._round is None or self._eval_todo or any(
                r.task.type == TaskType.EVALUATION for r in self._doing.values()
            ):
                return None
            finished, self._round = self._round, None
            if not finished.end_of_epoch and self._training_complete_locked():
                finished = finished._replace(end_of_epoch=True)
            self._epoch_evaluated = finished.end_of_epoch
            return finished

    def next_epoch(self):
        """Starts the next epoch's training, or ends the job after the last one."""
        with self._lock:
            if self.epoch + 1 < self.num_epochs:
                self._start_epoch(self.epoch + 1)
            else:
                self.epoch = self.num_epochs

    # -- persistence -----------------------------------------------------------------------

    def state(self):
        """A JSON-serialisable snapshot to carry on from after a restart (`from_state`).

        Keys: "format" (1); what it was made with: "shards" `[[path, num_records]]`,
        "records_per_task", "num_epochs"; "epoch" (num_epochs once the job is over);
        "last_task_id" (a restored manager never reuses an id); "waiting" and "running":
        the current epoch's training tasks as `[path, start, end, retries, origin]` and
        `[path, start, end, records_done, retries, origin]`; "epoch_done_records" and
        "coverage" (`Coverage.state()`) per epoch; "counters"; "slowest_task_s" per task
        type; "error". Evaluation tasks are not kept: a round open now is not restored.
        """
        with self._lock:
            running = [r for r in self._doing.values() if r.task.type == TaskType.TRAINING]
            return {
                "format": STATE_FORMAT,
                "shards": [[path, n] for path, n in self._shards],
                "records_per_task": self.records_per_task,
                "num_epochs": self.num_epochs,
                "epoch": self.epoch,
                "last_task_id": self._last_id,
                "waiting": [[t.path, t.start, t.end, t.retries, list(t.origin)]
                            for t in self._todo],
                "running": [[r.task.path, r.task.start, r.task.end, r.records_done,
                             r.task.retries, list(r.task.origin)] for r in running],
                "epoch_done_records": list(self._epoch_done_records),
                "coverage": [coverage.state() for coverage in self._coverage],
                "lost_tasks": {str(epoch): n for epoch, n in self._lost.items()},
                "counters": {
                    "tasks_done": self.tasks_done,
                    "tasks_failed": self.tasks_failed,
                    "tasks_requeued": self.tasks_requeued,
                    "tasks_handed_back": self.tasks_handed_back,
                    "tasks_timed_out": self.tasks_timed_out,
                },
                "slowest_task_s": {type_.value: s for type_, s in self._slowest.items()},
                "error": self.error,
            }

    @classmethod
    def from_state(cls, state, shards, records_per_task, num_epochs, max_task_retries,
                   eval_shards=(), seed=None):
        """A manager that carries on from `state()` (the arguments are the constructor's).

        Waiting tasks keep their retries; running ones are re-queued from their last
        reported record (records past it count as not trained), counting no retry. If the
        epoch's training was complete, `epoch_finished()` reports it again, so that its
        evaluation round is run again. A finished job's state restores as finished.

        Raises:
            ValueError: the state is not a format-1 task manager state, or `shards`,
                `records_per_task` or `num_epochs` differ from what it was made with.
        """
        _check_state(state, shards, records_per_task, num_epochs)
        manager = cls(shards, records_per_task, num_epochs, max_task_retries, eval_shards,
                      seed)
        try:
            manager._restore(state)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ValueError(
                f"state is not a valid task manager state; Received: {type(exc).__name__}: "
                f"{exc}"
            ) from exc
        return manager

    def _restore(self, state):
        with self._lock:
            epoch = int(state["epoch"])
            self.epoch = epoch
            self._epoch_span = {epoch: [None, None]}  # begun by an earlier run: not timed
            self._last_id = max(self._last_id, int(state["last_task_id"]))
            self._epoch_done_records = [int(n) for n in state["epoch_done_records"]]
            self._coverage = [Coverage.from_state(c) for c in state["coverage"]]
            self._lost = collections.Counter(
                {int(epoch): int(n) for epoch, n in dict(state.get("lost_tasks", {})).items()})
            counters = state["counters"]
            for name in ("tasks_done", "tasks_failed", "tasks_requeued", "tasks_handed_back",
                         "tasks_timed_out"):
                setattr(self, name, int(counters[name]))
            self._slowest = {TaskType(k): float(s) for k, s in state["slowest_task_s"].items()}
            self.error = str(state["error"])
            self._todo = [
                self._new_task(TaskType.TRAINING, path, start, end, epoch, retries, origin)
                for path, start, end, retries, origin in state["waiting"]
            ]
            for path, start, end, records_done, retries, origin in state["running"]:
                task = self._new_task(TaskType.TRAINING, path, start, end, epoch, retries,
                                      origin)
                self._requeue(_Running(task, -1, 0.0, int(records_done)), retry=False)


def _check_state(state, shards, records_per_task, num_epochs):
    if not isinstance(state, dict):
        raise ValueError(f"state must be a dict from TaskManager.state(); "
                         f"Received: {type(state).__name__}")
    if state.get("format") != STATE_FORMAT:
        raise ValueError(f"state format must be {STATE_FORMAT}; "
                         f"Received: format={state.get('format')!r}")
    saved = {str(path): int(n) for path, n in state.get("shards", ())}
    given = {str(path): int(n) for path, n in shards}
    for path, n in saved.items():
        if path not in given:
            raise ValueError(f"shards must hold every file the state was made with; "
                             f"{path!r} ({n} records) is missing. Received: "
                             f"{len(given)} files: {sorted(given)}")
        if given[path] != n:
            raise ValueError(f"shards must match the state: {path!r} had {n} records. "
                             f"Received: {given[path]} records for {path!r}")
    for path in given:
        if path not in saved:
            raise ValueError(f"shards must hold only files the state was made with; "
                             f"Received: {path!r}, not in the state's {sorted(saved)}")
    for name, value in (("records_per_task", records_per_task), ("num_epochs", num_epochs)):
        if state.get(name) != value:
            raise ValueError(f"{name} must match the state's {state.get(name)!r}; "
                             f"Received: {name}={value!r}")
