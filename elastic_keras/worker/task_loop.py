"""The worker's loop: ask the master for a task, run it, report, repeat until told to stop.

When `stop` is set (SIGTERM: preemption or scaling down), the worker finishes the minibatch
it is on, makes sure its push has landed, hands the task back after the records done, and
the loop returns: the process exits 0 well within the master's grace period.
"""

import logging
import threading
import traceback

import grpc
import tensorflow as tf

from elastic_keras.common.model_spec import Mode
from elastic_keras.data.reader import open_reader
from elastic_keras.proto import master_pb2

logger = logging.getLogger(__name__)

WAIT_S = 0.3
HAND_BACK_TIMEOUT_S = 10.0


class _Leaving(Exception):
    """Raised inside a task when the worker has been told to leave."""


class TaskLoop:
    """Runs the tasks the master hands to this worker.

    Args:
        config: this worker's `WorkerConfig`.
        spec: the loaded `ModelSpec`.
        master: a `MasterClient`.
        trainer: a `Trainer`.
        stop: a `threading.Event`; once set, the worker hands its task back and leaves.
    """

    def __init__(self, config, spec, master, trainer, stop=None):
        self._config = config
        self._spec = spec
        self._master = master
        self._trainer = trainer
        self._stop = stop or threading.Event()
        self._readers = {}

    def run(self):
        """Returns when the master has no more tasks, or after leaving on `stop`."""
        while not self._stop.is_set():
            task = self._master.get_task(self._config.worker_id)
            if task.type == master_pb2.TASK_NONE:
                logger.info("No more tasks; worker %d done", self._config.worker_id)
                return
            if task.type == master_pb2.TASK_WAIT:
                self._stop.wait(WAIT_S)
                continue
            self._run_task(task)
        logger.info("Worker %d told to stop; leaving", self._config.worker_id)

    def _run_task(self, task):
        state = {"records_done": 0, "losses": []}
        try:
            if task.type == master_pb2.TASK_TRAINING:
                metric_states = ()
                self._train(task, state)
            else:
                metric_states = self._evaluate(task, state)
        except _Leaving:
            self._hand_back(task, state["records_done"])
            return
        except Exception as exc:  # noqa: BLE001 - reported to the master, which decides
            if self._stop.is_set():  # e.g. a wait for a parameter server cut short
                self._hand_back(task, state["records_done"])
                return
            logger.error("Task %d failed:\n%s", task.task_id, traceback.format_exc())
            self._master.report_task_result(
                self._config.worker_id, task.task_id, state["records_done"],
                error=f"{type(exc).__name__}: {exc}", model_version=self._trainer.model_version,
            )
            return
        losses = state["losses"]
        self._master.report_task_result(
            self._config.worker_id, task.task_id, state["records_done"],
            loss=sum(losses) / len(losses) if losses else 0.0,
            model_version=self._trainer.model_version, metric_states=metric_states,
        )

    def _hand_back(self, task, records_done):
        logger.info("Handing task %d back after %d records", task.task_id, records_done)
        try:
            self._master.report_task_result(
                self._config.worker_id, task.task_id, records_done, abandoned=True,
                model_version=self._trainer.model_version, timeout_s=HAND_BACK_TIMEOUT_S,
            )
        except grpc.RpcError as exc:  # the master re-queues it when this worker exits
            logger.warning("Could not hand task %d back (%s)", task.task_id, exc.code().name)

    def _batches(self, task, mode):
        reader = self._readers.get(task.path)
        if reader is None:
            reader = open_reader(task.path, self._config.index_cache_dir)
            self._readers[task.path] = reader
        records = list(reader.read(task.start, task.end))
        dataset = tf.data.Dataset.from_tensor_slices(tf.constant(records, dtype=tf.string))
        dataset = self._spec.dataset_fn(dataset, mode, reader.metadata)
        return dataset.batch(self._config.minibatch_size).prefetch(tf.data.AUTOTUNE)

    def _train(self, task, state):
        every = self._config.progress_report_minibatches
        size = task.end - task.start
        pending = []
        for step, (features, labels) in enumerate(self._batches(task, Mode.TRAINING), 1):
            loss = self._trainer.train_minibatch(features, labels)
            state["losses"].append(loss)
            pending.append(loss)
            state["records_done"] = min(size, state["records_done"] + _batch_size(labels))
            if step % every == 0:
                self._trainer.flush()  # what is reported as trained has landed
                self._master.report_progress(
                    self._config.worker_id, task.task_id, state["records_done"],
                    sum(pending) / len(pending), self._trainer.model_version,
                )
                pending = []
            if self._stop.is_set():
                self._trainer.flush()  # what is handed back as done has landed
                raise _Leaving()
        self._trainer.flush()

    def _evaluate(self, task, state):
        states = self._trainer.evaluate(self._batches(task, Mode.EVALUATION))
        state["records_done"] = task.end - task.start
        return states


def _batch_size(labels):
    first = tf.nest.flatten(labels)[0]
    return int(first.shape[0]) if first.shape.rank else 1
