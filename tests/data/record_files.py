"""Record files of known content for the data package's tests."""

from pathlib import Path

from elastic_keras.data.tfrecord import TFRecordWriter


def tfrecord_records(count):
    """Records of varied lengths, including an empty one."""
    return [bytes([i % 251]) * (i * 7 % 300) + str(i).encode() if i else b"" for i in range(count)]


def write_tfrecord(path, records):
    with TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)
    return str(path)


def csv_records(count):
    return [f"{i},{i * 0.5},name {i}".encode() for i in range(count)]


def write_csv(path, records, header=b"id,score,name", newline=b"\n"):
    Path(path).write_bytes(b"".join(line + newline for line in [header, *records]))
    return str(path)
