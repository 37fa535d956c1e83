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

from elastic_keras.common.errors import PushRefused
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
        self._pipelines = {}  # (path, mode) -> _Pipeline

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
        # records_done: trained; landed: trained and on the parameter servers, which is all
        # a failed or handed-back task may claim (the rest is trained again); minibatches:
        # those whose pushes landed.
        state = {"records_done": 0, "landed": 0, "minibatches": 0, "losses": []}
        try:
            if task.type == master_pb2.TASK_TRAINING:
                metric_states = ()
                self._train(task, state)
            else:
                metric_states = self._evaluate(task, state)
        except _Leaving:
            self._hand_back(task, state)
            return
        except Exception as exc:  # noqa: BLE001 - reported to the master, which decides
            if isinstance(exc, PushRefused):  # a minibatch some shards applied, others not
                state["minibatches"] += 1
                dropped = exc.dropped
            else:
                dropped = self._settle_pushes(state)
            if self._stop.is_set():  # e.g. a wait for a parameter server cut short
                self._hand_back(task, state, dropped)
                return
            logger.error("Task %d failed:\n%s", task.task_id, traceback.format_exc())
            self._master.report_task_result(
                self._config.worker_id, task.task_id, state["landed"],
                error=f"{type(exc).__name__}: {exc}", model_version=self._trainer.model_version,
                minibatches=state["minibatches"], dropped=dropped,
            )
            return
        losses = state["losses"]
        self._master.report_task_result(
            self._config.worker_id, task.task_id, state["records_done"],
            loss=sum(losses) / len(losses) if losses else 0.0,
            model_version=self._trainer.model_version, metric_states=metric_states,
            minibatches=state["minibatches"],
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
                minibatches=state["minibatches"], dropped=dropped,
            )
        except grpc.RpcError as exc:  # the master re-queues it when this worker exits
            logger.warning("Could not hand task %d back (%s)", task.task_id, exc.code().name)

    def _batches(self, task, mode):
        """The minibatches of `task`'s records, through the module's `dataset_fn`."""
        reader = self._readers.get(task.path)
        if reader is None:
            reader = open_reader(task.path, self._config.index_cache_dir)
            self._readers[task.path] = reader
        key = (task.path, mode)
        pipeline = self._pipelines.get(key)
        if pipeline is None:
            pipeline = self._pipelines[key] = _Pipeline(
                self._spec.dataset_fn, mode, reader.metadata, self._config.minibatch_size)
        return pipeline.batches(list(reader.read(task.start, task.end)))

    def _train(self, task, state):
        every = self._config.progress_report_minibatches
        size = task.end - task.start
        pending = []
        for step, (features, labels) in enumerate(self._batches(task, Mode.TRAINING), 1):
            loss = self._trainer.train_minibatch(features, labels)
            state["losses"].append(loss)
            pending.append(loss)
            done = state["records_done"] = min(size, state["records_done"] + _batch_size(labels))
            self._trainer.after_landed(lambda n=done, k=step: state.update(landed=n,
                                                                           minibatches=k))
            if step % every == 0:
                # Sent once this step's push has landed (what is reported as trained is on
                # the parameter servers), while the next step computes.
                report = (self._config.worker_id, task.task_id, done,
                          sum(pending) / len(pending), self._trainer.model_version, step)
                self._trainer.after_landed(lambda r=report: self._master.report_progress(*r))
                pending = []
            if self._stop.is_set():
                self._trainer.flush()  # what is handed back as done has landed
                raise _Leaving()
        self._trainer.flush()

    def _evaluate(self, task, state):
        states = self._trainer.evaluate(self._batches(task, Mode.EVALUATION))
        state["records_done"] = state["landed"] = task.end - task.start
        return states


class _Pipeline:
    """The module's `dataset_fn` applied once for one file and mode; every task's records
    then flow through the same dataset.

    Applying `dataset_fn` to a new dataset per task would trace its map functions again for
    every task: for the MNIST zoo module about 0.1 s a task, a tenth of a task's training on
    2 cores. Here the dataset reads its records from a variable when an iterator starts, so
    each task only assigns its records and starts a new iterator. (A Python generator as the
    source slows the steps that run beside it by a third.)
    """

    def __init__(self, dataset_fn, mode, metadata, minibatch_size):
        self._records = tf.Variable(tf.zeros([0], tf.string), shape=tf.TensorShape([None]),
                                    trainable=False)
        records = tf.data.Dataset.from_tensors(0).flat_map(
            lambda _: tf.data.Dataset.from_tensor_slices(self._records.read_value()))
        self._dataset = dataset_fn(records, mode, metadata).batch(minibatch_size).prefetch(
            tf.data.AUTOTUNE)

    def batches(self, records):
        """An iterator of the minibatches of `records` (serialized records, as bytes); use
        one at a time (the next call gives the records of its own)."""
        self._records.assign(tf.constant(records, dtype=tf.string))
        return iter(self._dataset)


def _batch_size(labels):
    first = tf.nest.flatten(labels)[0]
    return int(first.shape[0]) if first.shape.rank else 1
