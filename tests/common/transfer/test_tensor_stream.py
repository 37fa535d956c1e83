"""Tensors over the PServer's streamed RPCs: options, push and pull parts, message-free
tensors, and conversion from and to the transfer dtype."""

import ml_dtypes
import numpy as np
import pytest
import tensorflow as tf

from elastic_keras.common.transfer import chunking, joining, tensor_codec, tensor_stream
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.transfer.tensor_stream import TransferOptions
from elastic_keras.proto import pserver_pb2

rng = np.random.default_rng(5)


PAIRS = [
    ("w", rng.standard_normal((300, 40)).astype(np.float32)),
    ("b", rng.standard_normal(7)),
    ("steps", np.array(3, np.int64)),
    ("rows", tensor_codec.Slices(rng.standard_normal((5, 4)).astype(np.float32),
                                 np.array([9, 2, 7, 0, 1]), (0, 4))),
]


def _pairs():
    return list(PAIRS)


@pytest.mark.parametrize("kwargs, message", [
    (dict(compression="zstd"),
     "--compression must be one of none, snappy, lz4, auto. Received: 'zstd'"),
    (dict(compression=None), "--compression must be one of .*Received: None"),
    (dict(chunk_bytes=0), "--chunk-bytes must be an integer from 1024 to 268435456. Received: 0"),
    (dict(chunk_bytes=1023), "--chunk-bytes must be an integer .*Received: 1023"),
    (dict(chunk_bytes=(256 << 20) + 1), "--chunk-bytes must be .*Received: 268435457"),
    (dict(chunk_bytes=4096.0), "--chunk-bytes must be an integer .*Received: 4096.0"),
    (dict(chunk_bytes=True), "--chunk-bytes must be an integer .*Received: True"),
    (dict(transfer_dtype="int8"),
     "--transfer-dtype must be one of float32, float16, bfloat16. Received: 'int8'"),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TransferOptions(**kwargs)


@pytest.mark.parametrize("chunk_bytes", [tensor_stream.MIN_CHUNK_BYTES,
                                         tensor_stream.MAX_CHUNK_BYTES])
def test_chunk_bytes_bounds_are_allowed(chunk_bytes):
    assert TransferOptions(chunk_bytes=chunk_bytes).chunk_bytes == chunk_bytes


def test_options_are_frozen():
    with pytest.raises(Exception):
        TransferOptions().compression = "lz4"


def test_options_describe_themselves():
    assert str(TransferOptions("lz4", 65536, "bfloat16")) == (
        "compression lz4, 65536-byte chunks, transfer dtype bfloat16")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_floats_travel_reduced_and_come_back_float32(dtype):
    options = TransferOptions(transfer_dtype=dtype)
    wire = options.encode(_pairs())
    assert [tensor_codec.decode(t).dtype.name if t.name != "rows" else
            tensor_codec.decode(t).values.dtype.name for t in wire] == [dtype, dtype, "int64",
                                                                        dtype]
    back = dict(tensor_stream.decode_tensors(wire))
    original = dict(_pairs())
    assert back["w"].dtype == np.float32 and back["b"].dtype == np.float32
    assert back["steps"].dtype == np.int64 and back["steps"] == 3
    np.testing.assert_allclose(back["w"], original["w"], rtol=2.0**-8, atol=2.0**-24)
    np.testing.assert_array_equal(back["rows"].ids, [9, 2, 7, 0, 1])
    assert back["rows"].values.dtype == np.float32


def test_full_precision_and_float32_send_values_as_they_are():
    for options, full in ((TransferOptions(transfer_dtype="float16"), True),
                          (TransferOptions(), False)):
        back = dict(tensor_stream.decode_tensors(options.encode(_pairs(), full)))
        assert back["b"].dtype == np.float64  # not narrowed, and not widened
        np.testing.assert_array_equal(back["w"], dict(_pairs())["w"])


def test_tf_tensors_and_indexed_slices_are_converted():
    options = TransferOptions(transfer_dtype="bfloat16")
    slices = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([4, 1], tf.int64),
                              tf.constant([6, 3], tf.int64))
    wire = options.encode([("t", tf.ones((2, 2))), ("s", slices)])
    assert tensor_codec.decode(wire[0]).dtype == ml_dtypes.bfloat16
    decoded = tensor_codec.decode(wire[1])
    assert decoded.values.dtype == ml_dtypes.bfloat16 and decoded.dense_shape == (6, 3)


def test_wire_tensors_view_the_arrays_and_make_equal_messages():
    array = rng.standard_normal((50, 3)).astype(np.float32)
    wire = tensor_codec.wire_tensor("a", array)
    assert np.shares_memory(np.frombuffer(wire.content, np.float32), array)
    assert tensor_codec.to_message(wire) == tensor_codec.encode("a", array)
    for value in (array, np.array(2.5, np.float64), array.T, array.astype(">f4"),
                  tensor_codec.Slices(array, np.arange(50), (0, 3))):
        message = tensor_codec.encode("a", value)
        assert tensor_codec.byte_sizes(message) == (len(message.content), len(message.ids))
        assert tensor_codec.to_message(tensor_codec.wire_tensor("a", value)) == message
    assert tensor_stream.payload_bytes([wire, tensor_codec.encode("i", np.arange(3))]) == 624


@pytest.mark.parametrize("codec", ["none", "lz4", "auto"])
def test_the_joiner_gives_wire_tensors_over_buffers(codec):
    pairs = _pairs()
    wire = TransferOptions().encode(pairs)
    joiner = joining.TensorJoiner()
    for frame in chunking.split_tensors(wire, codec, chunk_bytes=1024):
        joiner.add(chunking.decode_frame(chunking.encode_frame(frame)))
    joined = joiner.finish()
    assert all(isinstance(t, tensor_codec.WireTensor) and isinstance(t.content, memoryview)
               for t in joined)
    for (name, value), tensor in zip(pairs, joined):
        assert tensor.name == name
        assert tensor_codec.to_message(tensor) == tensor_codec.encode(name, value)


def test_a_push_without_tensors_is_one_part_with_its_header():
    header = pserver_pb2.PushHeader(worker_id=4, sequence=9, model_version=2)
    parts = list(tensor_stream.push_parts(header, [], TransferOptions()))
    assert len(parts) == 1
    assert not chunking.decode_frame(parts[0], pserver_pb2.PushGradientsPart).message.pieces
    read, tensors = tensor_stream.read_push(parts)
    assert (read.worker_id, read.sequence, read.model_version, tensors) == (4, 9, 2, [])


def test_push_parts_carry_the_header_first_and_only_there():
    options = TransferOptions("none", 4096)
    header = pserver_pb2.PushHeader(worker_id=1, sequence=2,
                                    deltas=[tensor_codec.encode("steps", np.array(4))])
    parts = list(tensor_stream.push_parts(header, options.encode(_pairs()), options))
    assert len(parts) > 3
    messages = [chunking.decode_frame(p, pserver_pb2.PushGradientsPart).message for p in parts]
    assert [m.HasField("header") for m in messages] == [True] + [False] * (len(parts) - 1)
    read, tensors = tensor_stream.read_push(parts)
    assert read == header
    assert [t.name for t in tensors] == ["w", "b", "steps", "rows"]


def test_an_empty_push_stream_is_rejected():
    with pytest.raises(PayloadError, match="needs at least one part"):
        tensor_stream.read_push([])


def test_pull_parts_round_trip_and_an_empty_pull_stream_is_rejected():
    options = TransferOptions("snappy", 2048, "float16")
    parts = list(tensor_stream.pull_parts(True, 12, options.encode(_pairs()), options, 77))
    first, tensors = tensor_stream.read_pull(parts)
    assert (first.initialized, first.model_version, first.incarnation, len(tensors)) == (
        True, 12, 77, 4)
    first, tensors = tensor_stream.read_pull(tensor_stream.pull_parts(False, 0, [], options))
    assert (first.initialized, first.model_version, tensors) == (False, 0, [])
    with pytest.raises(PayloadError, match="at least one part"):
        tensor_stream.read_pull(iter([]))


@pytest.mark.parametrize("codec", ["none", "lz4"])
def test_an_embedding_answer_is_one_frame_of_many_chunks_and_checked(codec):
    options = TransferOptions(codec, 1024)
    rows = rng.standard_normal((100, 16)).astype(np.float32)  # 6400 bytes: 7 chunks
    raw = tensor_stream.embedding_frame(
        41, options.encode([("items", rows), ("users", np.zeros((0, 8), np.float32))]), options)
    version, tensors = tensor_stream.read_embedding_frame(raw)
    (items, got), (users, empty) = tensor_stream.decode_tensors(tensors)
    assert (version, items, users, empty.shape) == (41, "items", "users", (0, 8))
    np.testing.assert_array_equal(got, rows)
    corrupt = bytearray(raw)
    corrupt[-100] ^= 0xFF  # a byte of the last chunk
    with pytest.raises(PayloadError, match="'items'.*checksum"):
        tensor_stream.read_embedding_frame(bytes(corrupt))
