"""The worker's input pipeline: a record `dataset_fn` cannot parse is named by its file and
its index in the file, whatever its format."""

import pytest
import tensorflow as tf

from elastic_keras.common.errors import DataError
from elastic_keras.common.model_spec import Mode, ModelSpec
from elastic_keras.data.reader import open_reader
from elastic_keras.data.tfrecord import TFRecordWriter
from elastic_keras.common.errors import ModelSpecError
from elastic_keras.worker.pipeline import RecordPipeline, StreamedPipeline, open_pipeline

FEATURES = {"x": tf.io.FixedLenFeature([1], tf.float32), "y": tf.io.FixedLenFeature([1],
                                                                                      tf.float32)}


def parse_examples(dataset, mode, metadata):
    examples = dataset.map(lambda record: tf.io.parse_single_example(record, FEATURES))
    return examples.map(lambda e: (e["x"], e["y"]))


def parse_batches(dataset, mode, metadata):
    examples = dataset.map(lambda records: tf.io.parse_example(records, FEATURES))
    return examples.map(lambda e: (e["x"], e["y"]))


def _spec(parser):
    if parser == "batch_dataset_fn":
        return ModelSpec("m", None, None, None, None, batch_dataset_fn=parse_batches)
    return ModelSpec("m", None, None, None, parse_examples)


def example(x):
    feature = {name: tf.train.Feature(float_list=tf.train.FloatList(value=[x]))
               for name in FEATURES}
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.mark.parametrize("parser", ["dataset_fn", "batch_dataset_fn"])
def test_an_unparsable_tfrecord_record_is_named_by_file_and_index(tmp_path, parser):
    records = [example(float(i)) for i in range(5)] + [b"not an example"] + [example(6.0)]
    path = str(tmp_path / "data.tfrecord")
    with TFRecordWriter(path) as writer:
        for record in records:
            writer.write(record)
    reader = open_reader(path, str(tmp_path / "index"))
    pipeline = open_pipeline(_spec(parser), Mode.TRAINING, reader, minibatch_size=2)
    assert isinstance(pipeline, StreamedPipeline if parser == "batch_dataset_fn"
                      else RecordPipeline)
    task_records = list(reader.read(2, 7))  # a task of records [2, 7)
    batches = pipeline.batches(task_records)
    x, _ = next(batches)  # records 2, 3
    assert x.numpy().ravel().tolist() == [2.0, 3.0]
    with pytest.raises(tf.errors.OpError) as raised:
        next(batches)  # records 4, 5
    error = pipeline.find_bad_record(task_records[2:], 4, raised.value)
    assert isinstance(error, DataError)
    assert str(error).startswith(f"The module's {parser} cannot parse record 5 of {path}: ")
    assert str(error).endswith("Received: b'not an example'")
    # The next task reads on as if nothing had happened.
    x, _ = next(pipeline.batches(task_records[:2]))
    assert x.numpy().ravel().tolist() == [2.0, 3.0]
    pipeline.close()


def _file(tmp_path, count):
    path = str(tmp_path / "data.tfrecord")
    with TFRecordWriter(path) as writer:
        for i in range(count):
            writer.write(example(float(i)))
    return open_reader(path, str(tmp_path / "index"))


def _xs(batches):
    return [x.numpy().ravel().tolist() for x, _ in batches]


def test_a_streamed_pipeline_reads_every_task_through_one_iterator(tmp_path):
    reader = _file(tmp_path, 12)
    pipeline = open_pipeline(_spec("batch_dataset_fn"), Mode.TRAINING, reader, 4)
    iterator = pipeline._stream[1]
    assert _xs(pipeline.batches(list(reader.read(0, 10)))) == [
        [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert _xs(pipeline.batches(list(reader.read(9, 12)))) == [[9, 10, 11]]
    assert _xs(pipeline.batches([])) == []
    assert pipeline._stream[1] is iterator  # no task started a new one
    # A task handed back half way: the next reads its own records.
    batches = pipeline.batches(list(reader.read(0, 12)))
    assert _xs([next(batches)]) == [[0, 1, 2, 3]]
    batches.close()
    assert _xs(pipeline.batches(list(reader.read(4, 6)))) == [[4, 5]]
    pipeline.close()


@pytest.mark.parametrize("broken, message", [
    # The task's last minibatch, two records, is dropped: the task's end shows it.
    (lambda d: d.filter(lambda r: tf.size(r) > 2),
     "one minibatch per minibatch of records, in order. Received: none for minibatch 1, "
     "then the task's end"),
    (lambda d: d.filter(lambda r: tf.size(r) > 5), "Received: none for minibatch 0, then "
                                                   "the task's end"),
    (lambda d: d.concatenate(d), "Received: none for minibatch 1, then one for minibatch 0"),
    (lambda d: d.filter(lambda r: tf.size(r) != 3),
     "Received: none for minibatch 0, then one for minibatch 1"),
    (lambda d: d.map(lambda r: r[:1]), "a row per record of each minibatch. Received: 1 rows "
                                       "for 3 records"),
])
def test_a_batch_dataset_fn_that_breaks_the_minibatch_contract_is_named(tmp_path, broken,
                                                                        message):
    reader = _file(tmp_path, 8)

    def parse(dataset, mode, metadata):
        return parse_batches(broken(dataset), mode, metadata)

    spec = ModelSpec("m", None, None, None, None, batch_dataset_fn=parse)
    pipeline = open_pipeline(spec, Mode.TRAINING, reader, 3)
    with pytest.raises(ModelSpecError, match=f"Model module 'm': .*{message}"):
        list(pipeline.batches(list(reader.read(0, 5))))
    pipeline.close()
