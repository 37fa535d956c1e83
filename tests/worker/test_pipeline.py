"""The worker's input pipeline: a record `dataset_fn` cannot parse is named by its file and
its index in the file, whatever its format."""

import pytest
import tensorflow as tf

from elastic_keras.common.errors import DataError
from elastic_keras.common.model_spec import Mode, ModelSpec
from elastic_keras.data.reader import open_reader
from elastic_keras.data.tfrecord import TFRecordWriter
from elastic_keras.worker.pipeline import RecordPipeline

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
    pipeline = RecordPipeline(_spec(parser), Mode.TRAINING, reader, minibatch_size=2)
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
