"""A worker's input pipeline: records of a file through the module's `dataset_fn` (or, where
it defines one, its `batch_dataset_fn`: see `ModelSpec.minibatches`), in minibatches, and the
record to blame when they cannot parse one.

Applying `dataset_fn` to a new dataset per task would trace its map functions again for
every task: for the MNIST zoo module about 0.1 s a task, a tenth of a task's training on
2 cores. A `RecordPipeline` applies it once per file and mode; its dataset reads its records
from a variable when an iterator starts, so each task only assigns its records and starts a
new iterator. (A Python generator as the source slows the steps that run beside it by a
third.)

A module with `batch_dataset_fn` gets a `StreamedPipeline`: its minibatches of raw records
go through one queue, into one iterator that lives as long as the worker keeps the file open
(`task_loop.OPEN_FILES`), so no task pays for a new iterator (14-50 ms for the DeepFM
module, more than parsing a whole task of 8 minibatches). Each minibatch carries a tag
through `batch_dataset_fn`, which must map it to exactly one minibatch of dense tensors, and
each task ends with a marker that bypasses it (zeros of its structure): a minibatch it drops,
splits or shrinks is named at once (`ModelSpecError`), never waited for.

TensorFlow names a record that fails to parse by its place in the tensor it was parsing
("record 0" of a one-line `decode_csv`), which says nothing about the file. When a batch
fails, `find_bad_record` runs the records it may hold one by one and names the first that
fails by its index in the file (and its line, for CSV).

Example:

    >>> pipeline = RecordPipeline(spec, Mode.TRAINING, reader, minibatch_size=64)  # doctest: +SKIP
    >>> for features, labels in pipeline.batches(list(reader.read(0, 640))): ...  # doctest: +SKIP
"""

import itertools
import re

import tensorflow as tf

from elastic_keras.common.errors import DataError, ModelSpecError

# Our functions in datasets are plain Python: AutoGraph converting one (parsing its source
# file) costs tens of ms, and converting `parsed` with the contract checks it calls 0.45 s.
_plain = tf.autograph.experimental.do_not_convert


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
            _plain(lambda _: tf.data.Dataset.from_tensor_slices(self._records.read_value())))
        self._dataset = spec.minibatches(records, mode, reader.metadata,
                                         minibatch_size).prefetch(tf.data.AUTOTUNE)
        self._parser = "batch_dataset_fn" if spec.batch_dataset_fn else "dataset_fn"

    def batches(self, records):
        """An iterator of the minibatches of `records` (serialized records, as bytes); use
        one at a time (the next call gives the records of its own)."""
        self._records.assign(tf.constant(records, dtype=tf.string))
        return iter(self._dataset)

    def close(self):
        """Nothing to release: each `batches` call has an iterator of its own."""

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


def open_pipeline(spec, mode, reader, minibatch_size):
    """The pipeline of `reader`'s records for `mode`: a `StreamedPipeline` where the module
    defines `batch_dataset_fn`, else a `RecordPipeline`."""
    kind = StreamedPipeline if spec.batch_dataset_fn is not None else RecordPipeline
    return kind(spec, mode, reader, minibatch_size)


class StreamedPipeline:
    """The module's `batch_dataset_fn` over a stream of minibatches of raw records, one
    iterator for every task of one file in one mode.

    Args and Raises: as `RecordPipeline`'s.
    """

    AHEAD = 8  # minibatches of raw records queued ahead of the one being read

    def __init__(self, spec, mode, reader, minibatch_size):
        self._spec, self._mode, self._reader = spec, mode, reader
        self._size = minibatch_size
        self._tags = itertools.count()
        self._stream = None
        self._records_pipeline = None  # per-record batches, to find a bad record
        self._open()

    def _open(self):
        queue = tf.queue.FIFOQueue(self.AHEAD * 4, [tf.int64, tf.string])
        spec, mode, metadata = self._spec, self._mode, self._reader.metadata

        @_plain
        def parsed(tag, records):
            # A minibatch of records goes through batch_dataset_fn; a task's end marker (a
            # negative tag) bypasses it as zeros of its structure, so it always comes out.
            # Not converted: the module's function is called as `RecordPipeline` calls it.
            records.set_shape([None])
            minibatches = spec.apply_batch_dataset_fn(
                tf.data.Dataset.from_tensors(records).take(tf.cast(tag >= 0, tf.int64)), mode,
                metadata)
            end = tf.data.Dataset.from_tensors(_zeros(minibatches.element_spec)).take(
                tf.cast(tag < 0, tf.int64))
            return tf.data.Dataset.zip((tf.data.Dataset.from_tensors(tag).repeat(),
                                        minibatches.concatenate(end)))

        source = tf.data.Dataset.from_tensors(0).repeat().map(_plain(lambda _: queue.dequeue()))
        options = tf.data.Options()
        options.autotune.enabled = False  # see `close`
        dataset = source.flat_map(parsed).prefetch(tf.data.AUTOTUNE).with_options(options)
        self._stream = (queue, iter(dataset))

    def batches(self, records):
        """An iterator of the minibatches of `records` (serialized records, as bytes); use
        one at a time (the next call gives the records of its own).

        Raises (when iterated):
            ModelSpecError: `batch_dataset_fn` did not map a minibatch of records to exactly
                one minibatch of as many rows.
        """
        if not records:
            return
        if self._stream is None:
            self._open()
        queue, iterator = self._stream
        pieces = [records[i:i + self._size] for i in range(0, len(records), self._size)]
        tags = [next(self._tags) for _ in pieces]
        end = -1 - tags[-1]
        plan = list(zip(tags, pieces)) + [(end, [])]
        queued = 0
        try:
            for index, (tag, piece) in enumerate(zip(tags, pieces)):
                while queued < min(len(plan), index + self.AHEAD):
                    queue.enqueue(plan[queued])
                    queued += 1
                got, minibatch = next(iterator)
                self._check(int(got), tag, minibatch, len(piece))
                yield minibatch
            while queued < len(plan):
                queue.enqueue(plan[queued])
                queued += 1
            got, _ = next(iterator)
            if int(got) != end:
                raise self._error("one minibatch per minibatch of records", f"more than one "
                                  f"for minibatch {int(got)}")
        except BaseException:
            self.close()  # what is queued and in flight belongs to no task: start afresh
            raise

    def _check(self, got, tag, minibatch, rows):
        if got != tag:
            then = "then the task's end" if got < 0 else f"then one for minibatch {got}"
            raise self._error("one minibatch per minibatch of records, in order",
                              f"none for minibatch {tag}, {then}")
        first = tf.nest.flatten(minibatch)[0]
        if first.shape.rank and first.shape[0] != rows:
            raise self._error("a row per record of each minibatch",
                              f"{first.shape[0]} rows for {rows} records")

    def _error(self, rule, received):
        return ModelSpecError(
            f"Model module '{self._spec.module_name}': `batch_dataset_fn(dataset, mode, "
            f"metadata)` must yield {rule}. Received: {received}")

    def find_bad_record(self, records, first, error):
        """As `RecordPipeline.find_bad_record`."""
        if self._records_pipeline is None:
            self._records_pipeline = RecordPipeline(self._spec, self._mode, self._reader,
                                                    self._size)
        return self._records_pipeline.find_bad_record(records, first, error)

    def close(self):
        """Ends the stream (a later `batches` opens another).

        The stream runs without tf.data's autotuning (its prefetch buffer still grows as
        needed): with it, deleting the iterator at times waited 1-10 s in its destructor
        for one of the iterator's threads, which held a worker's exit and would hold any
        close; without it, that wait was not seen.
        """
        if self._stream is not None:
            queue, _ = self._stream
            self._stream = None
            queue.close(cancel_pending_enqueues=True)


def _zeros(element_spec):
    """Zeros (empty strings) of the structure `element_spec` describes, unknown sizes 0.

    Raises:
        ModelSpecError: a component is not a dense tensor of known rank.
    """
    def zeros(spec):
        if not isinstance(spec, tf.TensorSpec) or spec.shape.rank is None:
            raise ModelSpecError(
                "batch_dataset_fn(dataset, mode, metadata) must yield dense tensors of known "
                f"rank; use dataset_fn for other kinds. Received: {spec}")
        return tf.zeros([d or 0 for d in spec.shape.as_list()], spec.dtype)

    return tf.nest.map_structure(zeros, element_spec)


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
