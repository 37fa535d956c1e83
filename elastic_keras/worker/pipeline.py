"""A worker's input pipeline: records of a file through the module's `dataset_fn` (or, where
it defines one, its `batch_dataset_fn`: see `ModelSpec.minibatches`), in minibatches, and the
record to blame when they cannot parse one.

Applying `dataset_fn` to a new dataset per task would trace its map functions again for
every task: for the MNIST zoo module about 0.1 s a task, a tenth of a task's training on
2 cores. A `RecordPipeline` applies it once per file and mode; its dataset reads its records
from a variable when an iterator starts, so each task only assigns its records and starts a
new iterator. (A Python generator as the source slows the steps that run beside it by a
third.)

TensorFlow names a record that fails to parse by its place in the tensor it was parsing
("record 0" of a one-line `decode_csv`), which says nothing about the file. When a batch
fails, `find_bad_record` runs the records it may hold one by one and names the first that
fails by its index in the file (and its line, for CSV).

Example:

    >>> pipeline = RecordPipeline(spec, Mode.TRAINING, reader, minibatch_size=64)  # doctest: +SKIP
    >>> for features, labels in pipeline.batches(list(reader.read(0, 640))): ...  # doctest: +SKIP
"""

import re

import tensorflow as tf

from elastic_keras.common.errors import DataError


class RecordPipeline:
    """The module's input function applied once to the records of one file, in one mode.

    Args:
        spec: the `ModelSpec`; its `minibatches` checks what the input function returns.
        mode: a `Mode`.
        reader: the file's `RecordReader`.
        minibatch_size: records per minibatch.

    Raises:
        ModelSpecError: the input function returned no dataset, or (training, evaluation)
            one whose elements are not `(features, labels)` pairs.
    """

    def __init__(self, spec, mode, reader, minibatch_size):
        self._reader = reader
        self._records = tf.Variable(tf.zeros([0], tf.string), shape=tf.TensorShape([None]),
                                    trainable=False)
        records = tf.data.Dataset.from_tensors(0).flat_map(
            lambda _: tf.data.Dataset.from_tensor_slices(self._records.read_value()))
        self._dataset = spec.minibatches(records, mode, reader.metadata,
                                         minibatch_size).prefetch(tf.data.AUTOTUNE)
        self._parser = "batch_dataset_fn" if spec.batch_dataset_fn else "dataset_fn"

    def batches(self, records):
        """An iterator of the minibatches of `records` (serialized records, as bytes); use
        one at a time (the next call gives the records of its own)."""
        self._records.assign(tf.constant(records, dtype=tf.string))
        return iter(self._dataset)

    def find_bad_record(self, records, first, error):
        """The `DataError` to raise for `error`, a TensorFlow error a batch raised.

        Args:
            records: the records the failing batch may hold, in file order.
            first: the index in the file of `records[0]`.
            error: the `tf.errors.OpError` the batch raised.

        Returns:
            A `DataError` naming the file, the first record of `records` that fails alone
            (its index in the file, and its line for CSV) and TensorFlow's complaint; if none
            fails alone, one naming the range.
        """
        complaint = _first_line(error)
        for offset, record in enumerate(records):
            try:
                next(self.batches([record]), None)
            except tf.errors.OpError as exc:
                where = self._reader.describe_record(first + offset)
                return DataError(f"The module's {self._parser} cannot parse {where}: "
                                 f"{_first_line(exc)}. Received: {bytes(record)[:200]!r}")
        return DataError(
            f"The module's {self._parser} failed on records [{first}, {first + len(records)}) of "
            f"{self._reader.path}: {complaint}"
        )


def _first_line(error):
    """A TensorFlow error's message without its node, its iterator and the record's place
    in the one-record tensor TensorFlow parsed ("in record 0")."""
    message = getattr(error, "message", None) or str(error)
    line = message.strip().splitlines()[0] if message.strip() else type(error).__name__
    for noise in _NOISE:
        line = noise.sub("", line)
    return line.rstrip(" .")[:300]


_NOISE = (re.compile(r"\{\{function_node [^}]*\}\}\s*"),
          re.compile(r"Error in user-defined function passed to \S+ transformation with "
                     r"iterator: \S+: "),
          re.compile(r" in record \d+"))
