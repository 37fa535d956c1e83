"""Where `elastic-keras predict` puts predictions: the module's `PredictionOutputsProcessor`,
or files under `--output`.

Workers send a prediction task's outputs with its result; the master takes them only when
the task ends done, which happens once per range of records: a task lost with its worker, or
handed back, is predicted again from its start, and its first attempt's outputs never
arrive. So every record is predicted exactly once, whatever dies on the way.

- With a `PredictionOutputsProcessor`, one instance lives in the master; `process(predictions,
  worker_id)` gets each minibatch of a done task, in record order (tasks come in any order),
  one call at a time, from a thread of its own (a worker's report only queues the task).
  `predictions` is what the model returned for the minibatch, as numpy arrays (a dict or
  list of them for a model with several outputs). A processor that raises fails the job.
- Without one, each done task becomes one file, `OUTPUT/predictions/part-FFFFF-SSSSSSSSSS.jsonl`
  (F: the data file's place in the sorted list of files, S: the task's first record), written
  atomically: one JSON object per record, in record order, `{"file": path, "record": index in
  the file, "prediction": ...}`, so predictions join back to their records. Part files an
  earlier job left there are removed when the job starts.
"""

import json
import logging
import os
import queue
import threading

import numpy as np

from elastic_keras.common.atomic_file import atomic_write
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.transfer.tensor_codec import decode

logger = logging.getLogger(__name__)

PREDICTIONS_DIR = "predictions"


class PredictionSink:
    """Takes the predictions of done tasks.

    Args:
        files: the prediction data's files, sorted (`list_shards` order).
        minibatch_size: records per call to the processor.
        processor: a `PredictionOutputsProcessor` instance, or None to write files.
        output: `--output`, where files go without a processor.
    """

    def __init__(self, files, minibatch_size, processor=None, output=""):
        self._file_index = {path: i for i, path in enumerate(files)}
        self._minibatch_size = minibatch_size
        self._processor = processor
        self._directory = os.path.join(output, PREDICTIONS_DIR) if output else ""
        if processor is None and self._directory:
            _remove_earlier_parts(self._directory)
        self.records = 0   # records whose predictions were handed on
        self.error = ""    # why the processor failed: the job fails
        # Workers' reports only queue: a slow processor holds no report past its deadline.
        self._queue = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._drain, name="predictions", daemon=True)
        self._thread.start()

    @property
    def where(self):
        """Where predictions go, in words."""
        if self._processor is not None:
            return f"{type(self._processor).__name__}.process"
        return self._directory or "nowhere (no --output)"

    def decode(self, task, tensors):
        """`{name: array}` of a task's outputs, checked: one row per record of `task`.

        Raises:
            PayloadError: no outputs, a tensor that cannot be decoded, names that repeat, or
                outputs without one row per record.
        """
        if not tensors:
            raise PayloadError("a prediction task's result must carry its predictions. "
                               "Received: none")
        outputs = {}
        for tensor in tensors:
            if tensor.name in outputs:
                raise PayloadError(f"output {tensor.name!r} is sent twice")
            array = decode(tensor)
            if not isinstance(array, np.ndarray) or array.ndim == 0:
                raise PayloadError(f"output {tensor.name!r} must be a dense tensor with one "
                                   f"row per record. Received: {type(array).__name__}")
            if len(array) != task.num_records:
                raise PayloadError(
                    f"output {tensor.name!r} must hold one row per record of the task "
                    f"({task.num_records}). Received: shape {tuple(array.shape)}")
            # A processor gets arrays of its own (writable), not views of the wire bytes.
            outputs[tensor.name] = np.array(array) if self._processor is not None else array
        return outputs

    def add(self, task, worker_id, outputs):
        """Queues a done task's outputs (from `decode`) for the sink's thread, which hands
        them on in the order they came; never waits (a slow processor holds the outputs of
        the tasks done meanwhile in memory)."""
        if self._closed:
            raise RuntimeError("predictions arrived after the sink was closed")
        self._queue.put((task, worker_id, outputs))

    def close(self):
        """Waits until every queued task is handed on; returns `error`."""
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        elif not self.error:
            self.error = f"{self.where} stopped handing predictions on"
        return self.error

    def _drain(self):
        while (item := self._queue.get()) is not None:
            if not self.error:  # after a failure the rest is dropped: the job fails
                self._hand_on(*item)

    def _hand_on(self, task, worker_id, outputs):
        try:
            if self._processor is not None:
                self._process(worker_id, outputs)
            elif self._directory:
                self._write(task, outputs)
        except BaseException as exc:  # noqa: BLE001 - the user's processor: the job fails
            self.error = (f"{self.where} failed on records [{task.start}, {task.end}) of "
                          f"{task.path}: {type(exc).__name__}: {exc}")
            logger.error("%s", self.error)
            return
        self.records += task.num_records

    def _process(self, worker_id, outputs):
        size = len(next(iter(outputs.values())))
        for start in range(0, size, self._minibatch_size):
            part = {name: array[start:start + self._minibatch_size]
                    for name, array in outputs.items()}
            self._processor.process(_as_returned(part), worker_id)

    def _write(self, task, outputs):
        place = self._file_index.get(task.path, 0)
        path = os.path.join(self._directory, f"part-{place:05d}-{task.start:010d}.jsonl")
        rows = {name: array.tolist() for name, array in outputs.items()}
        lines = []
        for i in range(task.num_records):
            one = {name: values[i] for name, values in rows.items()}
            lines.append(json.dumps({"file": task.path, "record": task.start + i,
                                     "prediction": _as_returned(one)}))
        os.makedirs(self._directory, exist_ok=True)
        with atomic_write(path, "w") as stream:
            stream.write("\n".join(lines) + "\n")


def _remove_earlier_parts(directory):
    """Removes the part files an earlier prediction job left in `directory` (they would mix
    with this job's); nothing else there is touched."""
    try:
        names = os.listdir(directory)
        earlier = [n for n in names if n.startswith("part-") and n.endswith(".jsonl")]
        for name in earlier:
            os.unlink(os.path.join(directory, name))
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ConfigError(f"--output: predictions go to {directory}, which must be a "
                          f"directory this job can write. Received: {exc}") from exc
    if earlier:
        logger.info("Removed %d prediction files an earlier job left in %s", len(earlier),
                    directory)


def _as_returned(named):
    """The outputs as the model returned them: one value for "", a list for "0", "1", ...,
    else a dict."""
    if list(named) == [""]:
        return named[""]
    if all(name.isdigit() for name in named):
        return [named[name] for name in sorted(named, key=int)]
    return named
