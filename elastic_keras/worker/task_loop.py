"""The worker's loop: ask the master for a task, run it, report, repeat until told to stop.

A trained task is reported once its last push has landed, without waiting for that (about
a push's round trip, 16-20 ms, at every task's end): the worker asks for its next task at
once, naming the one still landing (the master keeps it), and its report follows the push on
the trainer's background thread. Should that push fail, the next task meets the failure at
its first wait: the task before is reported failed, and the next one is handed back.

When `stop` is set (SIGTERM: preemption or scaling down), the worker finishes the minibatch
it is on, makes sure its push has landed, hands the task back after the records done, and
the loop returns: the process exits 0 well within the master's grace period.

A failed task is reported in one line (`failures.describe`), marked fatal when no retry
can help: the module breaks the contract (`ModelSpecError`, e.g. a non-scalar loss at the
first step), or a minibatch's loss is NaN or Inf under `--on-non-finite-loss fail`. Under
`skip` such a minibatch is not pushed; the task's report counts it
(`skipped_minibatches["non_finite_loss"]`) and training goes on (in synchronous training
the worker's next minibatch joins the round instead). A record `dataset_fn` cannot parse is
named by its file and index (`RecordPipeline.find_bad_record`).

The worker keeps the reader and pipelines of the `OPEN_FILES` files it read last, not of
every file: a pipeline holds its traced input function and, for `batch_dataset_fn`, a live
iterator's threads (about 5), so a job over thousands of files would hold thousands of
threads. A task of a file that fell out opens it again (its index and trace, tens of ms).
"""

import collections
import logging
import math
import threading
import traceback

import grpc
import tensorflow as tf

from elastic_keras.common.errors import NonFiniteLossError, PushRefused
from elastic_keras.common.model_spec import Mode
from elastic_keras.data.reader import open_reader
from elastic_keras.proto import master_pb2
from elastic_keras.worker import failures
from elastic_keras.worker.inference import Inference
from elastic_keras.worker.pipeline import open_pipeline

logger = logging.getLogger(__name__)

# Told to wait (an epoch or an evaluation round is being closed, or every task is taken),
# a worker asks again after FIRST_WAIT_S, then twice as long each time, up to WAIT_S: an
# epoch's turn takes the master milliseconds, and a worker waiting longer idles for it.
FIRST_WAIT_S = 0.01
WAIT_S = 0.3
HAND_BACK_TIMEOUT_S = 10.0
OPEN_FILES = 16


class _Leaving(Exception):
    """Raised inside a task when the worker has been told to leave."""


class _Landing:
    """A trained task whose result is reported once its last push has landed."""

    def __init__(self, task, state):
        self.task, self.state = task, state
        self.landed = False  # set (on the push thread) once that push is in


class TaskLoop:
    """Runs the tasks the master hands to this worker.

    Args:
        config: this worker's `WorkerConfig`.
        spec: the loaded `ModelSpec`.
        master: a `MasterClient`.
        trainer: a `Trainer`.
        stop: a `threading.Event`; once set, the worker hands its task back and leaves.
        inference: the `Inference` that evaluates and predicts (default: with `trainer`'s
            model alone; an ensemble's has every member's).
    """

    def __init__(self, config, spec, master, trainer, stop=None, inference=None):
        self._config = config
        self._spec = spec
        self._master = master
        self._trainer = trainer
        self._inference = inference or Inference(spec, [trainer])
        self._stop = stop or threading.Event()
        self._open = collections.OrderedDict()  # path -> (reader, {mode: pipeline}), by use
        self._landing = None  # the `_Landing` trained task whose last push may be in flight

    def run(self):
        """Returns when the master has no more tasks, or after leaving on `stop`."""
        try:
            self._run()
            self._settle_landing()
        finally:
            while self._open:
                self._close_oldest()

    def _run(self):
        wait = FIRST_WAIT_S
        while not self._stop.is_set():
            landing = self._landing
            task = self._master.get_task(self._config.worker_id,
                                         landing.task.task_id if landing else 0)
            if task.type == master_pb2.TASK_NONE:
                logger.info("No more tasks; worker %d done", self._config.worker_id)
                return
            if task.type == master_pb2.TASK_WAIT:
                self._stop.wait(wait)
                wait = min(2 * wait, WAIT_S)
                continue
            wait = FIRST_WAIT_S
            self._run_task(task)
        logger.info("Worker %d told to stop; leaving", self._config.worker_id)

    def _run_task(self, task):
        # records_done: trained (or skipped); landed: trained and on the parameter servers,
        # which is all a failed or handed-back task may claim (the rest is trained again);
        # pushed: minibatches pushed; minibatches: those whose pushes landed; skipped:
        # minibatches not pushed, by reason.
        state = {"records_done": 0, "landed": 0, "pushed": 0, "minibatches": 0, "losses": [],
                 "skipped": {}}
        metric_states, predictions = (), ()
        try:
            if task.type == master_pb2.TASK_TRAINING:
                self._train(task, state)
            elif task.type == master_pb2.TASK_PREDICTION:
                predictions = self._predict(task, state)
            else:
                metric_states = self._evaluate(task, state)
        except _Leaving:
            self._hand_back(task, state)
            return
        except Exception as exc:  # noqa: BLE001 - reported to the master, which decides
            if self._previous_task_failed(state, exc):
                self._hand_back(task, state)  # nothing of it was pushed
            else:
                self._report_failure(task, state, exc)
            return
        if task.type == master_pb2.TASK_TRAINING:
            self._report_once_landed(task, state)
        else:
            self._report(task, state, metric_states, predictions)

    def _report(self, task, state, metric_states=(), predictions=()):
        losses = state["losses"]
        self._master.report_task_result(
            self._config.worker_id, task.task_id, state["records_done"],
            loss=sum(losses) / len(losses) if losses else 0.0,
            model_version=self._trainer.model_version, metric_states=metric_states,
            minibatches=state["minibatches"], skipped=state["skipped"], predictions=predictions,
        )

    def _report_once_landed(self, task, state):
        """Reports a trained task once its last push has landed, without waiting for that:
        the worker asks for its next task meanwhile, naming this one as landing (the master
        keeps it), and trains on. Should the push fail, the next task meets the failure
        first (`_previous_task_failed`)."""
        landing = self._landing = _Landing(task, state)

        def report():
            landing.landed = True
            self._report(task, state)
            self._landing = None  # only now: asked for a task meanwhile, it is named

        self._trainer.after_landed(report)

    def _previous_task_failed(self, state, exc):
        """Whether `exc`, raised by a task (of `state`) that has pushed nothing, may be the
        failure of the last push of the task before, still landing when it began: that task
        is then reported failed, and this one is to be handed back whole.

        That push is the first a task waits for: once this task has pushed, it had landed.
        Else it is landed now: if it fails now, `exc` may still be the same failure (met
        first through the report waiting on it), so this task goes back all the same (a
        failure of its own shows again when it runs again).
        """
        landing = self._landing
        if landing is None or state["pushed"]:
            return False
        if self._land(landing):
            return True
        if self._landing is None:  # it landed, and the task was reported
            return False
        self._fail_landing(landing, exc)
        return True

    def _settle_landing(self):
        """Before leaving: lands the last task's last push, which reports that task."""
        landing = self._landing
        if landing is not None:
            self._land(landing)

    def _land(self, landing):
        """Lands every push made so far, which reports `landing`'s task; reports it failed
        (or its lost report again) if a push fails now. Returns whether one did."""
        try:
            self._trainer.flush()
        except Exception as exc:  # noqa: BLE001 - that task's: reported
            self._fail_landing(landing, exc)
            return True
        return False

    def _fail_landing(self, landing, exc):
        """Reports a landing task that its push will not report: failed by `exc`, or, if the
        push landed and `exc` is its report's failure, done (sent again: a repeated result
        changes nothing)."""
        self._landing = None
        if landing.landed:
            self._report(landing.task, landing.state)
        else:
            self._report_failure(landing.task, landing.state, exc)

    def _report_failure(self, task, state, exc):
        if isinstance(exc, PushRefused):  # a minibatch some shards applied, others not
            state["minibatches"] += 1
            dropped = exc.dropped
        else:
            dropped = self._settle_pushes(state)
        if self._stop.is_set():  # e.g. a wait for a parameter server cut short
            self._hand_back(task, state, dropped)
            return
        error = failures.describe(exc)
        fatal = failures.fatal(exc, self._config.on_non_finite_loss)
        logger.error("Task %d failed%s: %s", task.task_id,
                     " (the job fails: no retry can help)" if fatal else "", error)
        (logger.debug if failures.is_told(exc) else logger.error)(
            "Task %d failed here:\n%s", task.task_id, "".join(traceback.format_exception(exc)))
        self._master.report_task_result(
            self._config.worker_id, task.task_id, state["landed"], error=error,
            model_version=self._trainer.model_version, minibatches=state["minibatches"],
            dropped=dropped, fatal=fatal, skipped=state["skipped"],
        )

    def _settle_pushes(self, state):
        """After a failure that was not a push's: lets the push in flight land, so that the
        report counts it. Returns `{shard: why}` of shards that refused it."""
        try:
            self._trainer.flush()
        except PushRefused as exc:
            state["minibatches"] += 1
            return exc.dropped
        except Exception:  # noqa: BLE001 - its outcome is unknown: it is not counted
            logger.warning("The push in flight when the task failed did not land")
        return {}

    def _hand_back(self, task, state, dropped=None):
        records_done = state["landed"]
        logger.info("Handing task %d back after %d records", task.task_id, records_done)
        try:
            self._master.report_task_result(
                self._config.worker_id, task.task_id, records_done, abandoned=True,
                model_version=self._trainer.model_version, timeout_s=HAND_BACK_TIMEOUT_S,
                minibatches=state["minibatches"], dropped=dropped, skipped=state["skipped"],
            )
        except grpc.RpcError as exc:  # the master re-queues it when this worker exits
            logger.warning("Could not hand task %d back (%s)", task.task_id, exc.code().name)

    def _pipeline(self, path, mode):
        """(the `RecordReader` of `path`, its pipeline for `mode`), kept while `path` is
        one of the `OPEN_FILES` files read last."""
        opened = self._open.pop(path, None)
        if opened is None:
            opened = (open_reader(path, self._config.index_cache_dir), {})
        self._open[path] = opened  # the most recent
        while len(self._open) > OPEN_FILES:
            self._close_oldest()
        reader, pipelines = opened
        if mode not in pipelines:
            pipelines[mode] = open_pipeline(self._spec, mode, reader,
                                            self._config.minibatch_size)
        return reader, pipelines[mode]

    def _close_oldest(self):
        _, (_, pipelines) = self._open.popitem(last=False)
        for pipeline in pipelines.values():
            pipeline.close()

    def _batches(self, task, mode, state=None):
        """The minibatches of `task`'s records, through the module's `dataset_fn`.

        Raises:
            DataError: `dataset_fn` cannot parse a record (the first not yet trained of
                `state`, or of the task, on that fails alone is named).
        """
        reader, pipeline = self._pipeline(task.path, mode)
        records = reader.read(task.start, task.end)
        batches = pipeline.batches(records)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except tf.errors.OpError as exc:
                at = state["records_done"] if state else 0
                raise pipeline.find_bad_record(records[at:], task.start + at, exc) from exc
            yield batch

    def _train(self, task, state):
        every = self._config.progress_report_minibatches
        size = task.end - task.start
        pending = []
        for step, (features, labels) in enumerate(self._batches(task, Mode.TRAINING, state), 1):
            first = state["records_done"]
            done = min(size, first + _batch_size(labels))
            loss = self._train_minibatch(task, step, (first, done), features, labels, state)
            state["records_done"] = done
            if loss is not None:
                state["pushed"] += 1
                state["losses"].append(loss)
                pending.append(loss)
            self._trainer.after_landed(lambda n=done, k=state["pushed"]: state.update(
                landed=n, minibatches=k))
            if step % every == 0:
                # Sent once this step's push has landed (what is reported as trained is on
                # the parameter servers), while the next step computes.
                report = (self._config.worker_id, task.task_id, done,
                          sum(pending) / len(pending) if pending else math.nan,
                          self._trainer.model_version, state["pushed"], dict(state["skipped"]))
                self._trainer.after_landed(lambda r=report: self._master.report_progress(*r))
                pending = []
            if self._stop.is_set():
                self._trainer.flush()  # what is handed back as done has landed
                raise _Leaving()

    def _train_minibatch(self, task, step, records, features, labels, state):
        """Trains one minibatch; returns its loss, or None if it was skipped.

        Raises:
            NonFiniteLossError: its loss is NaN or Inf, with `--on-non-finite-loss fail`; the
                message names the minibatch, the task and the worker.
        """
        try:
            return self._trainer.train_minibatch(features, labels)
        except NonFiniteLossError as exc:
            where = (f"minibatch {step} (records [{task.start + records[0]}, "
                     f"{task.start + records[1]}) of {task.path}) of task {task.task_id} on "
                     f"worker {self._config.worker_id}")
            if self._config.on_non_finite_loss != "skip":
                raise NonFiniteLossError(
                    f"{str(exc).rstrip('.')} in {where}; nothing of it was pushed "
                    "(--on-non-finite-loss fail: the job fails)") from exc
            skipped = state["skipped"]
            skipped[failures.NON_FINITE_LOSS] = skipped.get(failures.NON_FINITE_LOSS, 0) + 1
            logger.warning("%s in %s: skipped, not pushed (--on-non-finite-loss skip)",
                           str(exc).rstrip("."), where)
            return None

    def _evaluate(self, task, state):
        states = self._inference.evaluate(self._batches(task, Mode.EVALUATION))
        state["records_done"] = state["landed"] = task.end - task.start
        return states

    def _predict(self, task, state):
        # Nothing of a prediction task counts until its result: it is handed back whole.
        predictions = self._inference.predict(self._leaving_batches(task, Mode.PREDICTION),
                                              task.end - task.start)
        state["records_done"] = state["landed"] = task.end - task.start
        return predictions

    def _leaving_batches(self, task, mode):
        for batch in self._batches(task, mode):
            yield batch
            if self._stop.is_set():
                raise _Leaving()


def _batch_size(labels):
    first = tf.nest.flatten(labels)[0]
    return int(first.shape[0]) if first.shape.rank else 1
