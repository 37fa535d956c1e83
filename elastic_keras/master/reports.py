"""The workers' side of the job: tasks handed out, progress and results reported.

The servicer calls in here from gRPC threads: `get_task`, `report_progress`,
`report_task_result`. The reports feed the task queue, the training throughput and loss, the
push account, the minibatches workers skipped (`skipped_minibatches`), the evaluation results
and the highest model version seen; the main loop reads them back for its policy and for
the progress line. A result marked fatal (no retry can help) fails the job at once; `fatal`
keeps why ("model_module": the job then ends as a bad model module does). A prediction task's
outputs go to `predictions` (a `PredictionSink`) once it ends done, an evaluation task's
metric states to `evaluations`; outputs that do not fit its records, and metric states that
cannot be merged with the round's, fail the attempt instead.
"""

import collections
import logging
import os
import threading
import time

from elastic_keras.common.errors import MODEL_MODULE, ModelSpecError, PayloadError
from elastic_keras.master.push_account import PushAccount
from elastic_keras.master.tasks import TaskOutcome, TaskType
from elastic_keras.master.throughput import Throughput

logger = logging.getLogger(__name__)

EVENTS_EVERY_S = 5.0  # how often training scalars go to the TensorBoard event file


class Reports:
    """What workers report, kept for the master's loop.

    Args:
        membership: the job's `Membership` (the shards report their versions there).
        evaluations: the job's `Evaluations`.

    `tasks`, the `TaskManager`, is set once the data is listed; until then no task is
    handed out.
    """

    def __init__(self, membership, evaluations):
        self.tasks = None
        self.no_more_tasks = False  # tells workers to exit
        self.paused = False  # no task goes out (the callbacks have not begun the epoch)
        self.membership = membership
        self.evaluations = evaluations
        self.throughput = Throughput()
        self.worker_throughput = collections.defaultdict(Throughput)  # worker id -> its own
        self.pushes = PushAccount()
        self.first_task_at = None  # training time counts from the first task handed out
        self._lock = threading.Lock()
        self._model_version = 0
        self._events_at = 0.0
        self._skipped = {}  # task id -> (worker id, {reason: minibatches}), per attempt
        self.fatal = ""  # why the first fatal task result could not be retried
        self.predictions = None  # a prediction job's `PredictionSink`
        self.inferred = 0  # records of evaluation and prediction tasks done
        # Held from a task's end to its outputs being taken (the round closes after both).
        self.results_lock = threading.Lock()
        # Set once a result leaves nothing to hand out until the master's loop acts (the job
        # is over, or no task waits or runs: an epoch's training or a round has ended), with
        # all of the result recorded: the loop waits on it between its ticks, so the next
        # epoch or round begins as soon as one ends.
        self.drained = threading.Event()

    @property
    def model_version(self):
        """The highest model version any worker or shard has reported."""
        with self._lock:
            return max(self._model_version, self.membership.model_version)

    def note_version(self, version):
        """A model version reached (reported, or that a resumed job starts from)."""
        with self._lock:
            self._model_version = max(self._model_version, version)

    @property
    def training_ends(self):
        """Whether the last epoch's tasks, of any type, are all handed out (or no task is
        left): the job's end is one task away."""
        tasks = self.tasks
        if self.no_more_tasks or tasks is None:
            return self.no_more_tasks
        waiting, _ = tasks.depth()
        return not waiting and tasks.epoch >= tasks.num_epochs - 1

    def get_task(self, worker_id, landing_task_id=0):
        """The next task for `worker_id`, or None (see `no_more_tasks` for why).

        A worker runs one task at a time, and may have one more that it finished training
        whose last push is still landing, named by `landing_task_id` (it reports that task
        once the push lands, and trains the next one meanwhile). Any other task it still
        holds, it has given up (its reply was lost, or it is another launch's), so it is
        re-queued from the last record reported, as a lost worker's would be. No worker
        holds more than two tasks, and only one that it is training.
        """
        if self.tasks is None or self.no_more_tasks or self.paused:
            return None
        held = self.tasks.recover_worker(worker_id, keep=landing_task_id)
        if held:
            logger.warning("Worker %d asked for a task while holding %d; re-queued it from its "
                           "last progress report", worker_id, held)
        task = self.tasks.get(worker_id)
        if task is not None and self.first_task_at is None:
            self.first_task_at = time.time()
        if task is not None and task.takes_over:
            logger.info("Worker %d takes over %s records [%d, %d) of %s (task %d)", worker_id,
                        task.type.value, task.start, task.end, os.path.basename(task.path),
                        task.task_id)
        return task

    def _another_workers(self, worker_id, task_id):
        """Whether `task_id` runs on a worker other than `worker_id` (logged: a worker
        reports only on its own tasks; reports on tasks no longer running are ignored)."""
        holder = self.tasks.holder(task_id)
        if holder is None or holder == worker_id:
            return False
        logger.warning("Worker %d reported on task %d, which worker %d runs; ignored",
                       worker_id, task_id, holder)
        return True

    def report_progress(self, worker_id, task_id, records_done, loss, model_version,
                        minibatches=0, skipped=None):
        if self._another_workers(worker_id, task_id):
            return
        self.note_version(model_version)
        self._note_skipped(task_id, worker_id, skipped)
        if minibatches:
            self.pushes.report(task_id, worker_id, minibatches)
        before = self.tasks.records_done(task_id)
        self.tasks.report_progress(task_id, records_done)
        self._trained(worker_id, max(0, self.tasks.records_done(task_id) - before), loss)

    def report_task_result(self, worker_id, task_id, records_done, error, loss,
                           model_version, metric_states, abandoned=False, minibatches=0,
                           dropped=None, fatal="", skipped=None, predictions=()):
        if self._another_workers(worker_id, task_id):
            return
        outputs = {}
        if not error and not abandoned and self.predictions is not None:
            outputs, error = self._predictions_of(task_id, predictions)
        self.note_version(model_version)
        if minibatches or dropped:
            self.pushes.report(task_id, worker_id, minibatches, dropped)
        self._note_skipped(task_id, worker_id, skipped)
        before = self.tasks.records_done(task_id)
        fatal = fatal if error and not abandoned else ""
        with self.results_lock:
            if not error and not abandoned:
                error = self._unmergeable(task_id, metric_states)
            task, outcome = self.tasks.report_result(task_id, records_done, error, abandoned,
                                                     fatal=bool(fatal))
            if (task is not None and task.type != TaskType.TRAINING
                    and outcome == TaskOutcome.DONE):
                self._take_outputs(task, worker_id, outputs, metric_states, model_version)
        if task is None:
            return
        if fatal and outcome == TaskOutcome.FAILED:
            with self._lock:
                self.fatal = self.fatal or fatal
        if task.type == TaskType.TRAINING:
            trained = records_done if error or abandoned else task.num_records
            self._trained(worker_id, max(0, trained - before), None if error else loss)
        if abandoned:
            logger.info("Worker %d handed back %s task %d after %d records", worker_id,
                        task.type.value, task_id, records_done)
        elif error:
            logger.warning("Worker %d failed %s task %d (%s): %s", worker_id,
                           task.type.value, task_id, outcome.value, error)
        tasks = self.tasks
        if tasks.finished or tasks.depth() == (0, 0):
            self.drained.set()

    def _take_outputs(self, task, worker_id, outputs, metric_states, model_version):
        with self._lock:
            self.inferred += task.num_records
        if task.type == TaskType.PREDICTION:
            self.predictions.add(task, worker_id, outputs)
        else:
            self.evaluations.add(metric_states, model_version)

    def _unmergeable(self, task_id, metric_states):
        """Why an evaluation task's metric states cannot join its round (the attempt then
        fails), or "". Called with `results_lock` held: no other task's states join
        between this check and the task's own."""
        task = self.tasks.running(task_id)
        if task is None or task.type != TaskType.EVALUATION:
            return ""
        return self.evaluations.check(metric_states)

    def _predictions_of(self, task_id, tensors):
        """(`{name: array}`, "") of a prediction task's outputs, or ({}, why they do not
        fit its records: the attempt then fails)."""
        task = self.tasks.running(task_id)
        if task is None or task.type != TaskType.PREDICTION:
            return {}, ""
        try:
            return self.predictions.decode(task, tensors), ""
        except PayloadError as exc:
            return {}, f"the worker's predictions do not fit the task: {exc}"

    def raise_for_bad_module(self, error):
        """Raises `ModelSpecError(error)` if the job failed because a worker found the model
        module breaking the contract (as the module check before launch would)."""
        if self.fatal == MODEL_MODULE:
            raise ModelSpecError(error)

    def _note_skipped(self, task_id, worker_id, skipped):
        """Records a task attempt's skipped minibatches so far (counted from its start)."""
        if not skipped:
            return
        with self._lock:
            _, known = self._skipped.get(task_id, (worker_id, {}))
            merged = {reason: max(n, known.get(reason, 0)) for reason, n in skipped.items()}
            self._skipped[task_id] = (worker_id, {**known, **merged})

    def skipped_minibatches(self):
        """(`{reason: n}` over the job, `{worker id as text: {reason: n}}`): training
        minibatches workers did not push (a NaN loss with --on-non-finite-loss skip)."""
        total, by_worker = {}, {}
        with self._lock:
            attempts = sorted(self._skipped.values(), key=lambda a: a[0])
        for worker_id, counts in attempts:
            mine = by_worker.setdefault(str(worker_id), {})
            for reason, n in sorted(counts.items()):
                total[reason] = total.get(reason, 0) + n
                mine[reason] = mine.get(reason, 0) + n
        return total, by_worker

    def _trained(self, worker_id, records, loss):
        self.throughput.add(records, loss)
        self.worker_throughput[worker_id].add(records, loss)

    def show(self, console, config, events=None):
        """Updates the progress line, and every `EVENTS_EVERY_S` the training scalars."""
        if config.job_type != "train":
            console.status(f"{config.job_type}: records {self.inferred}/"
                           f"{self.tasks.round_records}  version {self.model_version}")
            return
        num_epochs = config.num_epochs
        epoch, done, total = self.tasks.progress()
        loss = self.throughput.loss
        examples_per_second = self.throughput.examples_per_second()
        version = self.model_version
        console.status(
            f"epoch {epoch + 1}/{num_epochs}  records {done}/{total}  "
            f"loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"{examples_per_second:.0f} examples/s  version {version}"
        )
        now = time.monotonic()
        if events and loss is not None and now - self._events_at >= EVENTS_EVERY_S:
            self._events_at = now
            waiting, running = self.tasks.training_load()
            events.scalars({
                "train/loss": loss, "train/examples_per_second": examples_per_second,
                "train/tasks_waiting": waiting, "train/tasks_running": running,
                "train/workers": sum(w["registered"]
                                     for w in self.membership.view()[0].values()),
                **{f"worker/{w}/examples_per_second": t.examples_per_second()
                   for w, t in sorted(self.worker_throughput.items())},
                **self.membership.mean_staleness(), **self._table_scalars()}, version)

    def _table_scalars(self):
        """TensorBoard scalars of each embedding table, over all shards: rows held, rows
        admitted and evicted, lookups not admitted."""
        return {f"tables/{name}/{key}": counts["total"][key]
                for name, counts in self.membership.tables().items()
                for key in ("rows", "admitted", "evicted", "not_admitted_lookups")}
