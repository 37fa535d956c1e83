"""The task queue: epochs of training tasks, re-queues, timeouts and coverage.

Each epoch's tasks (`tasks.Task`, ranges of records cut by `data.shards.split_range`) are
handed out in a shuffled order.

Re-queues. A task goes back to the front of the queue, resuming after the last record its
worker reported (evaluation and prediction tasks start over: their result holds all they make):

- its worker reports an error: a retry. A task may be retried `max_task_retries` times; one
  more error fails the job with that task's error, as does at once a `fatal` one;
- its worker is lost (`recover_worker`), hands it back (`report_result(abandoned=True)`) or
  holds it too long (`overdue`, `requeue_overdue`). None of these is the task's fault, so no
  retry is counted.

Evaluation rounds (`start_evaluation`, see `evaluation_rounds`) pause the training tasks;
`get()` returns None meanwhile (the worker waits). `state()` and `from_state` carry the
queue across a restart of the master (see `task_state`). All methods are thread-safe: the
master's gRPC threads and its main loop share one manager.

Example:
    tasks = TaskManager([("train-0.tfrecord", 1000)], records_per_task=100, num_epochs=2,
                        max_task_retries=3, eval_shards=[("test-0.tfrecord", 200)])
    task = tasks.get(worker_id=0)
    tasks.report_result(task.task_id, 100)
"""

import random
import threading

from elastic_keras.data.shards import split_range
from elastic_keras.master.epoch_ledger import EpochLedger
from elastic_keras.master.evaluation_rounds import EvaluationRounds
from elastic_keras.master.running_tasks import Running, RunningTasks
from elastic_keras.master.task_state import COUNTERS, QueueState
from elastic_keras.master.tasks import Task, TaskOutcome, TaskType


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
        eval_type: the rounds' `TaskType`: PREDICTION for a prediction job (one round).
    """

    def __init__(self, shards, records_per_task, num_epochs, max_task_retries,
                 eval_shards=(), seed=None, eval_type=TaskType.EVALUATION):
        self._shards = [(str(path), int(n)) for path, n in shards]
        self.records_per_task = records_per_task
        self._train_ranges = _ranges(self._shards, records_per_task)
        self._rounds = EvaluationRounds(_ranges(eval_shards, records_per_task), eval_type)
        self.round_records = sum(int(n) for _, n in eval_shards)
        self.records_per_epoch = sum(n for _, n in self._shards)
        self.num_epochs = num_epochs
        self.max_task_retries = max_task_retries
        self._rng = random.Random(seed)
        self._last_id = 0
        self._lock = threading.Lock()
        self._todo: list[Task] = []  # training tasks of the current epoch
        self._doing = RunningTasks()
        self._ledger = EpochLedger(num_epochs, self.records_per_epoch)
        self.epoch = -1
        self.tasks_done = 0
        self.tasks_failed = 0
        self.tasks_requeued = 0     # every re-queue, whatever the reason
        self.tasks_handed_back = 0  # re-queues asked for by the worker (abandoned=True)
        self.tasks_timed_out = 0    # re-queues by `requeue_overdue`
        self.error = ""
        self._start_epoch(0)

    def _new_task(self, type_, path, start, end, epoch, retries=0, origin=None, version=0):
        self._last_id += 1
        return Task(self._last_id, type_, path, start, end, epoch, version, retries,
                    tuple(origin or (path, start, end)))

    def _start_epoch(self, epoch):
        self.epoch = epoch
        self._rounds.epoch_evaluated = False
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
            and not self._todo and not self._rounds.waiting and not self._doing
        )

    failed = property(lambda self: bool(self.error))
    tasks_per_epoch = property(lambda self: len(self._train_ranges))

    def epoch_counts(self):
        """Per epoch, how many records were trained at least once and more than once."""
        with self._lock:
            return self._ledger.counts()

    def progress(self):
        """(epoch, records of that epoch done, records per epoch), for the progress line."""
        with self._lock:
            epoch = min(self.epoch, self.num_epochs - 1)
            running = sum(r.records_done for r in self._doing.of_type() if r.task.epoch == epoch)
            return epoch, self._ledger.done_records[epoch] + running, self.records_per_epoch

    def records_done(self, task_id):
        """How far into running task `task_id` its worker has reported (0 if not running)."""
        with self._lock:
            return getattr(self._doing.get(task_id), "records_done", 0)

    def training_load(self):
        """(training tasks `get()` may hand out now: 0 while a round is open, running)."""
        with self._lock:
            waiting = 0 if self._rounds.open_round is not None else len(self._todo)
            return waiting, self._training_running_locked()

    def depth(self):
        """(tasks of any type waiting to be handed out, tasks running): the queue's depth."""
        with self._lock:
            return len(self._todo) + len(self._rounds.waiting), len(self._doing)

    def _training_running_locked(self):
        return len(self._doing.of_type())

    def _training_complete_locked(self):
        return not self._todo and not self._training_running_locked()

    def running(self, task_id):
        """Running task `task_id` (a `Task`), or None."""
        with self._lock:
            return getattr(self._doing.get(task_id), "task", None)

    def holder(self, task_id):
        """The worker running task `task_id`, or None when it is not running."""
        with self._lock:
            return getattr(self._doing.get(task_id), "worker_id", None)

    def running_tasks(self):
        with self._lock:
            return self._doing.held()

    def training_workers(self):
        """Ids of the workers running a training task now."""
        with self._lock:
            return {r.worker_id for r in self._doing.of_type()}

    # -- handing out -----------------------------------------------------------------------

    def get(self, worker_id):
        """The next task for `worker_id`, or None when there is nothing to do right now."""
        with self._lock:
            if self._finished_locked():
                return None
            if self._rounds.open_round is not None:
                task = self._rounds.next_task(self._training_running_locked())
            elif self._todo:
                task = self._todo.pop(0)
                self._ledger.began(task.epoch)
            else:
                task = None
            if task is not None:
                self._doing.start(task, worker_id)
            return task

    def start_evaluation(self, model_version, end_of_epoch=True):
        """Opens an evaluation round of the validation data at `model_version`.

        Training tasks already running finish; then every evaluation task is handed out,
        and training resumes once they are all back (see `evaluation_finished`).

        Args:
            model_version: the model version the round is for.
            end_of_epoch: True for the round that closes the epoch (after `epoch_finished()`
                returned it), False for a round in the middle of an epoch.

        Returns False, queuing nothing, with no validation data, once the job is over, once
        the epoch's closing round has ended, or for a mid-epoch round while one is open;
        else True (a round already open then closes the epoch). Raises ValueError if
        `end_of_epoch` while the epoch still has training to do.
        """
        with self._lock:
            if self._finished_locked() or self.epoch >= self.num_epochs:
                return False
            return self._rounds.start(self.epoch, model_version, end_of_epoch, self._new_task,
                                      (len(self._todo), self._training_running_locked()))

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
            self._ledger.trained(task, running.records_done)

    def report_result(self, task_id, records_done, error="", abandoned=False, fatal=False):
        """Ends a task.

        Args:
            task_id: the task.
            records_done: records of it the worker got through.
            error: why it failed; empty when it succeeded.
            abandoned: the worker hands the task back (it is being preempted): the rest of
                it is re-queued, counting neither a retry nor a failure.
            fatal: with `error`, no retry can help: the job fails at once.

        Returns:
            `(task, TaskOutcome)`; task is None with IGNORED (a task that is not running).
        """
        with self._lock:
            running = self._doing.pop(task_id)
            if running is None:
                return None, TaskOutcome.IGNORED
            task = running.task
            succeeded = not error and not abandoned
            self._advance(running, task.num_records if succeeded else records_done)
            if abandoned:
                self.tasks_handed_back += 1
                self._requeue(running, retry=False)
                return task, TaskOutcome.REQUEUED
            if succeeded:
                self._finish(running)
                return task, TaskOutcome.DONE
            self.tasks_failed += 1
            if fatal or task.retries >= self.max_task_retries:
                times = "" if fatal else f" {task.retries + 1} times; last error"
                self.error = (f"{task.type.value} task on {task.path} records "
                              f"[{task.start}, {task.end}) failed{times}: {error}")
                return task, TaskOutcome.FAILED
            self._requeue(running, retry=True)
            return task, TaskOutcome.REQUEUED

    def _finish(self, running):
        task = running.task
        self.tasks_done += 1
        if task.type == TaskType.TRAINING:
            self._ledger.done_records[task.epoch] += task.num_records
            if task.epoch == self.epoch and self._training_complete_locked():
                self._ledger.ended(task.epoch)
        self._doing.completed(running)

    def _requeue(self, running, retry):
        task = running.task
        self.tasks_requeued += 1
        if task.type != TaskType.TRAINING:
            resume = task.start  # its metrics or predictions come only with its result
        else:
            resume = task.start + running.records_done
            self._ledger.done_records[task.epoch] += running.records_done
        if resume >= task.end:
            self.tasks_done += 1
            return
        again = self._new_task(task.type, task.path, resume, task.end, task.epoch,
                               task.retries + int(retry), task.origin, task.model_version)
        again.takes_over = not retry
        queue = self._todo if task.type == TaskType.TRAINING else self._rounds.waiting
        queue.insert(0, again)

    def recover_worker(self, worker_id, keep=0):
        """Re-queues every task held by `worker_id` (it is gone) but task `keep`, counting no
        retry, each from the last record its worker reported (the rest is trained again,
        unseen: counted in `EpochCounts.tasks_lost`); returns how many."""
        with self._lock:
            lost = [r for r in self._doing.of_worker(worker_id) if r.task.task_id != keep]
            for running in lost:
                self._doing.pop(running.task.task_id)
                self._lose(running)
            return len(lost)

    def _lose(self, running):
        if running.task.type == TaskType.TRAINING:
            self._ledger.lost[running.task.epoch] += 1
        self._requeue(running, retry=False)

    # -- timeouts --------------------------------------------------------------------------

    def overdue(self, floor_s, factor=3.0, now=None):
        """Running tasks held too long (see `RunningTasks.overdue`)."""
        with self._lock:
            return self._doing.overdue(floor_s, factor, now)

    def requeue_overdue(self, task_id):
        """Re-queues running task `task_id` (see `overdue`) like a lost worker's (its later
        reports are ignored); returns the worker that held it, or None if it is not running."""
        with self._lock:
            running = self._doing.pop(task_id)
            if running is None:
                return None
            self.tasks_timed_out += 1
            self._lose(running)
            return running.worker_id

    # -- epochs and rounds -----------------------------------------------------------------

    def epoch_finished(self):
        """The current epoch's number once its training is all done (the caller then starts
        its closing evaluation round, or not, and calls `next_epoch()`); else None, also
        while a round is open (it then closes the epoch) and after the closing round."""
        with self._lock:
            if (self.error or self.epoch >= self.num_epochs
                    or self._rounds.open_round is not None or self._rounds.epoch_evaluated):
                return None
            return self.epoch if self._training_complete_locked() else None

    def evaluation_finished(self):
        """The `EvalRound` that just ended (once), else None; with `end_of_epoch` (see
        `EvaluationRounds.finish`) the caller then calls `next_epoch()`."""
        with self._lock:
            evaluating = self._doing.of_type(self._rounds.task_type)
            return self._rounds.finish(evaluating, self._training_complete_locked())

    def next_epoch(self, stop=False):
        """Starts the next epoch's training, or ends the job after the last one (`stop`:
        after this one, the later epochs left out)."""
        with self._lock:
            if self.epoch + 1 < self.num_epochs and not stop:
                self._start_epoch(self.epoch + 1)
            else:
                self.epoch = self.num_epochs

    # -- persistence -----------------------------------------------------------------------

    def state(self):
        """A JSON-serialisable snapshot to carry on from after a restart (`from_state`;
        the format is `task_state.QueueState`'s)."""
        with self._lock:
            running = self._doing.of_type()
            return QueueState(
                shards=self._shards, records_per_task=self.records_per_task,
                num_epochs=self.num_epochs, epoch=self.epoch, last_task_id=self._last_id,
                waiting=[(t.path, t.start, t.end, t.retries, t.origin) for t in self._todo],
                running=[(r.task.path, r.task.start, r.task.end, r.records_done,
                          r.task.retries, r.task.origin) for r in running],
                epoch_done_records=self._ledger.done_records,
                coverage=self._ledger.coverage, lost_tasks=dict(self._ledger.lost),
                counters={name: getattr(self, name) for name in COUNTERS},
                slowest_task_s=dict(self._doing.slowest), error=self.error,
            ).to_json()

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
        saved = QueueState.from_json(state, shards, records_per_task, num_epochs)
        manager = cls(shards, records_per_task, num_epochs, max_task_retries, eval_shards,
                      seed)
        manager._restore(saved)
        return manager

    def _restore(self, saved):
        with self._lock:
            epoch = self.epoch = saved.epoch
            self._ledger.restored(epoch, saved.epoch_done_records, saved.coverage,
                                  saved.lost_tasks)
            self._last_id = max(self._last_id, saved.last_task_id)
            for name in COUNTERS:
                setattr(self, name, saved.counters[name])
            self._doing.slowest = dict(saved.slowest_task_s)
            self.error = saved.error
            self._todo = [
                self._new_task(TaskType.TRAINING, path, start, end, epoch, retries, origin)
                for path, start, end, retries, origin in saved.waiting
            ]
            for path, start, end, records_done, retries, origin in saved.running:
                task = self._new_task(TaskType.TRAINING, path, start, end, epoch, retries,
                                      origin)
                self._requeue(Running(task, -1, 0.0, records_done), retry=False)


def _ranges(shards, records_per_task):
    return [(path, start, end) for path, n in shards
            for start, end in split_range(n, records_per_task)]
