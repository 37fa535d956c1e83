"""Codecs, chunked tensor streams and reduced-precision transfer."""

import grpc
import ml_dtypes
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from elastic_keras.common import rpc
from elastic_keras.common.transfer import (
    chunking, compression, joining, tensor_codec, transfer_dtype,
)
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.proto import tensor_pb2, transfer_pb2

DTYPES = [np.float16, ml_dtypes.bfloat16, np.float32, np.float64, np.int32, np.int64]
CHUNK = 1024  # small chunks keep multi-chunk cases fast
ROW = 4       # sparse tensors: elements per row
rng = np.random.default_rng(0)


def _half_zero(n, dtype):
    """n values of `dtype`: the first half zeros (compressible), the rest random (not)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        values = rng.integers(-(2**30), 2**30, size=n)
    else:
        values = rng.standard_normal(n)
    values[: n // 2] = 0
    return values.astype(dtype)


# ---------------------------------------------------------------- codecs


@pytest.mark.parametrize("name", compression.WIRE_CODECS)
class TestWireCodecContract:
    """What every codec that can appear on the wire must do."""

    @pytest.mark.parametrize("size", [0, 1, 100, 70_000])
    def test_round_trip(self, name, size):
        codec = compression.get_codec(name)
        raw = bytes(size // 2) + rng.bytes(size - size // 2)
        data = codec.compress(raw)
        assert isinstance(data, bytes)
        assert codec.decompress(data, size) == raw
        out = bytearray(size)
        codec.decompress_into(data, memoryview(out))
        assert out == raw

    @pytest.mark.parametrize("delta", [-1, 1])
    def test_decompressed_size_mismatch_is_rejected(self, name, delta):
        codec = compression.get_codec(name)
        raw = bytes(500) + b"tail"
        with pytest.raises(PayloadError, match=f"{name} data must decompress to {504 + delta}"):
            codec.decompress(codec.compress(raw), len(raw) + delta)

    def test_pack_never_grows_a_chunk(self, name):
        raw = rng.bytes(10_000)
        used, data = compression.get_codec(name).pack(raw)
        assert (used, data) == ("none", raw)

    def test_truncated_data_is_a_payload_error(self, name):
        codec = compression.get_codec(name)
        raw = bytes(2000) + rng.bytes(100)
        data = codec.compress(raw)
        with pytest.raises(PayloadError):
            codec.decompress(data[: len(data) // 2], len(raw))

    def test_garbage_fails_only_with_payload_error(self, name):
        # Formats without a checksum may read garbage as valid data: the chunk's checksum,
        # checked before decompressing, is what catches corruption.
        codec = compression.get_codec(name)
        for size in (1, 10, 100, 1000):
            try:
                codec.decompress(rng.bytes(size), 2100)
            except PayloadError:
                pass


def test_snappy_and_lz4_shrink_zeros():
    for name in ("snappy", "lz4"):
        used, data = compression.get_codec(name).pack(bytes(100_000))
        assert used == name and len(data) < 10_000


def test_none_pack_does_not_copy_bytes():
    raw = rng.bytes(100)
    assert compression.get_codec("none").pack(raw)[1] is raw


def test_unknown_codec_names_are_rejected():
    with pytest.raises(ConfigError, match="none, snappy, lz4, auto. Received: 'zstd'"):
        compression.get_codec("zstd")
    with pytest.raises(PayloadError, match="Received: 'auto'"):
        compression.wire_codec("auto")  # a policy, never a label on the wire


@pytest.mark.parametrize("size", [100_000, 4 << 20])  # whole-chunk rule and sampled rule
def test_auto_sends_random_floats_raw(size):
    raw = rng.standard_normal(size // 4).astype(np.float32).tobytes()
    used, data = compression.get_codec("auto").pack(raw)
    assert used == "none" and data is raw


@pytest.mark.parametrize("size", [100_000, 4 << 20])
def test_auto_compresses_mostly_zero_gradients(size):
    values = rng.standard_normal(size // 4).astype(np.float32)
    values[rng.random(values.size) < 0.9] = 0
    raw = values.tobytes()
    used, data = compression.get_codec("auto").pack(raw)
    assert used == "snappy" and len(data) < 0.5 * len(raw)
    assert compression.wire_codec(used).decompress(data, len(raw)) == raw


def test_auto_skips_compressing_a_large_chunk_whose_samples_do_not_shrink(monkeypatch):
    auto = compression.get_codec("auto")
    monkeypatch.setattr(type(auto), "compress", lambda self, data: pytest.fail("compressed"))
    assert auto.pack(rng.bytes(1 << 20))[0] == "none"


def test_auto_needs_to_halve_a_chunk():
    # 40% zeros: snappy shrinks it by about that much, not enough to be worth its time.
    raw = bytes(40_000) + rng.bytes(60_000)
    assert len(compression.get_codec("snappy").compress(raw)) < 0.7 * len(raw)
    assert compression.get_codec("auto").pack(raw)[0] == "none"
    raw = bytes(60_000) + rng.bytes(40_000)
    assert compression.get_codec("auto").pack(raw)[0] == "snappy"


# ---------------------------------------------------------------- chunked streams

SIZES = {  # content bytes, as a function of the element size
    "empty": lambda itemsize: 0,
    "small": lambda itemsize: 3 * ROW * itemsize,
    "one_chunk": lambda itemsize: CHUNK,
    "chunks_and_remainder": lambda itemsize: 3 * CHUNK + CHUNK // 2,
}


def _wire(dtype, size, sparse):
    elements = SIZES[size](np.dtype(dtype).itemsize) // np.dtype(dtype).itemsize
    values = _half_zero(elements, dtype)
    if not sparse:
        return tensor_codec.wire_tensor("w", values)
    rows = elements // ROW
    ids = rng.permutation(10 * rows + 1)[:rows]
    return tensor_codec.wire_tensor(
        "emb", tensor_codec.Slices(values.reshape(rows, ROW), ids, (0, ROW)))


def _fields(tensor):
    """A wire tensor's fields, its bytes as `bytes`, to compare tensors made either way."""
    return (tensor.name, tensor.dtype, tuple(tensor.shape), bytes(tensor.content),
            bytes(tensor.ids), tuple(tensor.dense_shape))


def _same(received, sent):
    assert [_fields(t) for t in received] == [_fields(t) for t in sent]


def _sent(frames):
    """What a receiver gets of `frames`: each encoded to bytes and decoded again."""
    return [chunking.decode_frame(chunking.encode_frame(f)) for f in frames]


def _pieces(frames):
    """`[piece, its chunk's bytes or None]` of every piece of `frames`, in order."""
    pieces = []
    for frame in frames:
        data = iter(frame.data)
        for piece in frame.message.pieces:
            pieces.append([piece, bytes(next(data)) if piece.HasField("chunk") else None])
    return pieces


def _stream(pieces):
    """One frame of `pieces` (as `_pieces` gives them), sent: encoded and decoded again."""
    message = transfer_pb2.TransferMessage(pieces=[piece for piece, _ in pieces])
    data = [data for piece, data in pieces if piece.HasField("chunk")]
    return _sent([chunking.Frame(message, data)])


@pytest.mark.parametrize("codec", compression.CODEC_NAMES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
@pytest.mark.parametrize("size", list(SIZES))
def test_round_trip(codec, dtype, sparse, size):
    wire = _wire(dtype, size, sparse)
    frames = list(chunking.split_tensors([wire], codec=codec, chunk_bytes=CHUNK))
    chunks = [p.chunk for p, _ in _pieces(frames) if p.HasField("chunk")]
    content_size, ids_size = len(wire.content), len(wire.ids)
    assert len(chunks) == -(-content_size // CHUNK) + -(-ids_size // CHUNK)
    assert all(c.raw_size <= CHUNK and c.size <= c.raw_size for c in chunks)
    assert {c.codec for c in chunks} <= set(compression.WIRE_CODECS)
    (joined,) = joining.join_tensors(_sent(frames))
    _same([joined], [wire])
    decoded = tensor_codec.decode(joined)
    expected = tensor_codec.decode(wire)
    if sparse:
        np.testing.assert_array_equal(decoded.values, expected.values)
        np.testing.assert_array_equal(decoded.ids, expected.ids)
    else:
        np.testing.assert_array_equal(decoded, expected)


def test_a_frame_is_a_transfer_frame_message():
    """Any protobuf reader can read a frame: a TransferFrame whose meta is the stream message
    and whose payload is its chunks' bytes, in order."""
    wire = [_wire(np.float32, "chunks_and_remainder", False)]
    (frame, *_) = chunking.split_tensors(wire, codec="lz4", chunk_bytes=CHUNK)
    parsed = transfer_pb2.TransferFrame.FromString(chunking.encode_frame(frame))
    assert transfer_pb2.TransferMessage.FromString(parsed.meta) == frame.message
    assert parsed.payload == b"".join(bytes(d) for d in frame.data)
    # And a frame serialized by protobuf itself decodes.
    decoded = chunking.decode_frame(parsed.SerializeToString())
    assert decoded.message == frame.message
    assert [bytes(d) for d in decoded.data] == [bytes(d) for d in frame.data]


def test_many_tensors_share_frames_and_big_ones_spread():
    small = [tensor_codec.wire_tensor(f"b{i}", np.full(10, i, np.float32)) for i in range(50)]
    big = tensor_codec.wire_tensor("big", rng.standard_normal(5 * CHUNK // 4).astype(np.float32))
    wire = [*small[:25], big, *small[25:]]
    frames = list(chunking.split_tensors(wire, codec="none", chunk_bytes=CHUNK))
    assert len(frames) <= 10
    assert all(sum(len(d) for d in f.data) <= CHUNK for f in frames)
    _same(joining.join_tensors(_sent(frames)), wire)


def test_joiner_takes_one_frame_at_a_time():
    wire = [_wire(np.float32, "chunks_and_remainder", True), _wire(np.int64, "small", False)]
    joiner = joining.TensorJoiner()
    for frame in _sent(chunking.split_tensors(wire, codec="lz4", chunk_bytes=CHUNK)):
        joiner.add(frame)
    _same(joiner.finish(), wire)


def test_a_whole_uncompressed_chunk_is_received_in_place():
    """One chunk sent raw is the tensor: its bytes are a view of the frame, not a copy; a
    tensor of several chunks is joined into a buffer of its own."""
    small = tensor_codec.wire_tensor("small", np.arange(100, dtype=np.float32))
    big = _wire(np.float32, "chunks_and_remainder", False)
    raw = [chunking.encode_frame(f) for f in
           chunking.split_tensors([small, big], codec="none", chunk_bytes=CHUNK)]
    joined = joining.join_tensors(chunking.decode_frame(r) for r in raw)
    assert joined[0].content.obj is raw[0] and joined[0].content.readonly
    assert joined[1].content.obj is not raw[-1] and not joined[1].content.readonly
    _same(joined, [small, big])


def _rpc_message_type():
    """An RPC's own stream message: `repeated TransferPiece pieces = 1; int64 sequence = 2;`."""
    pool = descriptor_pool.Default()
    name = "elastic_keras.test.PushPart"
    try:
        descriptor = pool.FindMessageTypeByName(name)
    except KeyError:
        file = descriptor_pb2.FileDescriptorProto(
            name="elastic_keras/test/push_part.proto", package="elastic_keras.test",
            syntax="proto3", dependency=["elastic_keras/proto/transfer.proto"])
        message = file.message_type.add(name="PushPart")
        message.field.add(name="pieces", number=1, type_name=".elastic_keras.TransferPiece",
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE)
        message.field.add(name="sequence", number=2,
                          label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                          type=descriptor_pb2.FieldDescriptorProto.TYPE_INT64)
        pool.Add(file)
        descriptor = pool.FindMessageTypeByName(name)
    return message_factory.GetMessageClass(descriptor)


def test_an_rpc_own_message_type_carries_the_stream_beside_its_fields():
    part = _rpc_message_type()
    wire = [_wire(np.float32, "chunks_and_remainder", True), _wire(np.int32, "small", False)]
    frames = list(chunking.split_tensors(wire, "snappy", CHUNK, message_type=part))
    assert all(isinstance(f.message, part) for f in frames) and len(frames) > 1
    frames[0].message.sequence = 7
    frames.append(chunking.Frame(part(sequence=8), []))  # a request-level part of its own
    received = [chunking.decode_frame(chunking.encode_frame(f), part) for f in frames]
    _same(joining.join_tensors(received), wire)
    assert [f.message.sequence for f in received if f.message.sequence] == [7, 8]


def test_small_tensor_is_one_chunk_sent_as_is_with_codec_none():
    wire = tensor_codec.wire_tensor("w", np.arange(100, dtype=np.float32))
    (frame,) = chunking.split_tensors([wire], codec="none")
    header, chunk = frame.message.pieces[0].header, frame.message.pieces[1].chunk
    assert (header.content_chunks, header.ids_chunks, header.content_size) == (1, 0, 400)
    assert (chunk.codec, chunk.raw_size, chunk.size) == ("none", 400, 400)
    assert frame.data[0].obj is wire.content.obj  # a view of the array, not a copy


def test_split_rejects_bad_arguments():
    wire = [_wire(np.float32, "small", False)]
    with pytest.raises(ConfigError, match="chunk_bytes must be an integer >= 1"):
        chunking.split_tensors(wire, chunk_bytes=0)
    with pytest.raises(ConfigError, match="Received: 'gzip'"):
        chunking.split_tensors(wire, codec="gzip")


def _split_pieces(codec="none", sparse=False):
    """The pieces of a stream of tensor 'w'/'emb' (4 content chunks) then 'next' (1 chunk)."""
    wire = [_wire(np.float32, "chunks_and_remainder", sparse),
            tensor_codec.wire_tensor("next", np.ones(3, np.float32))]
    return _pieces(chunking.split_tensors(wire, codec=codec, chunk_bytes=CHUNK))


def _chunk_at(pieces, tensor, field, index):
    for position, (piece, _) in enumerate(pieces):
        chunk = piece.chunk
        if piece.HasField("chunk") and (chunk.tensor, chunk.field, chunk.index) == (
                tensor, field, index):
            return position
    raise AssertionError(f"no chunk {tensor} {field}[{index}]")


def _join_fails(pieces, *patterns):
    with pytest.raises(PayloadError) as info:
        joining.join_tensors(_stream(pieces))
    for pattern in patterns:
        assert pattern in str(info.value), str(info.value)
    return str(info.value)


@pytest.mark.parametrize("codec", compression.CODEC_NAMES)
@pytest.mark.parametrize("offset", [0, -1])
def test_a_flipped_byte_fails_the_checksum(codec, offset):
    pieces = _split_pieces(codec)
    where = _chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 2)
    data = bytearray(pieces[where][1])
    data[offset] ^= 0x01
    pieces[where][1] = bytes(data)
    _join_fails(pieces, "Tensor 'w'", "chunk content[2]", "fails its checksum")


def test_a_corrupt_ids_chunk_is_named():
    pieces = _split_pieces("snappy", sparse=True)
    pieces[_chunk_at(pieces, "emb", transfer_pb2.CHUNK_IDS, 0)][0].chunk.checksum ^= 1
    _join_fails(pieces, "Tensor 'emb'", "chunk ids[0]", "fails its checksum")


@pytest.mark.parametrize("index", [0, 1, 3])
def test_a_missing_chunk_is_named(index):
    pieces = _split_pieces()
    del pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, index)]
    _join_fails(pieces, "Tensor 'w'", f"content[{index}] of 4", "missing")


def test_a_stream_that_ends_inside_a_tensor_is_rejected():
    pieces = _split_pieces()[:-1]  # the last chunk of 'next'
    _join_fails(pieces, "Tensor 'next'", "content[0] of 1 is missing", "end of the stream")


def test_a_missing_header_is_named():
    pieces = _split_pieces()
    del pieces[next(i for i, (p, _) in enumerate(pieces) if p.header.name == "next")]
    _join_fails(pieces, "Tensor 'next'", "chunk content[0]", "before the tensor's header")


def test_a_duplicated_chunk_is_named():
    pieces = _split_pieces()
    position = _chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 1)
    pieces.insert(position + 1, pieces[position])
    _join_fails(pieces, "Tensor 'w'", "chunk content[1]", "duplicated")


def test_a_duplicated_last_chunk_is_named():
    pieces = _split_pieces()
    position = _chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 3)
    pieces.insert(position + 1, pieces[position])
    _join_fails(pieces, "Tensor 'w'", "chunk content[3]", "after the tensor's last chunk")


def test_reordered_chunks_are_named():
    pieces = _split_pieces()
    first = _chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 1)
    pieces[first], pieces[first + 1] = pieces[first + 1], pieces[first]
    _join_fails(pieces, "Tensor 'w'", "expected chunk content[1] of 4",
                "chunk content[2]", "out of order")


def test_content_and_ids_chunks_must_not_swap():
    pieces = _split_pieces(sparse=True)
    last_content = _chunk_at(pieces, "emb", transfer_pb2.CHUNK_CONTENT, 3)
    ids = _chunk_at(pieces, "emb", transfer_pb2.CHUNK_IDS, 0)
    pieces[last_content], pieces[ids] = pieces[ids], pieces[last_content]
    _join_fails(pieces, "Tensor 'emb'", "expected chunk content[3]", "chunk ids[0]")


@pytest.mark.parametrize("label", ["zstd", "auto", ""])
def test_an_unknown_codec_label_is_named(label):
    pieces = _split_pieces()
    pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 1)][0].chunk.codec = label
    _join_fails(pieces, "Tensor 'w'", "chunk content[1]: ", repr(label))


def _replace_data(piece, codec, raw):
    """Gives `piece` (a `[piece, bytes]` pair) `raw` compressed with `codec`, checksummed."""
    data = compression.get_codec(codec).compress(raw)
    piece[0].chunk.codec = codec
    piece[0].chunk.size = len(data)
    piece[0].chunk.checksum = chunking.checksum(data)
    piece[1] = data


@pytest.mark.parametrize("codec", compression.WIRE_CODECS)
def test_data_that_decompresses_to_the_wrong_size_is_named(codec):
    pieces = _split_pieces()
    piece = pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 1)]
    _replace_data(piece, codec, bytes(CHUNK - 8))  # a valid checksum of the wrong bytes
    _join_fails(pieces, "Tensor 'w'", "chunk content[1]: ",
                f"must decompress to {CHUNK} bytes")


@pytest.mark.parametrize("raw_size, message", [
    (0, "between 1 and"), (5 * CHUNK, "between 1 and"),
])
def test_a_chunk_raw_size_outside_its_tensor_is_named(raw_size, message):
    pieces = _split_pieces()
    pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 0)][0].chunk.raw_size = raw_size
    _join_fails(pieces, "Tensor 'w'", "chunk content[0]", message)


def test_the_last_chunk_must_complete_its_field():
    pieces = _split_pieces()
    pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 3)][0].chunk.raw_size -= 1
    _join_fails(pieces, "Tensor 'w'", "content[3], the last, must hold the remaining")


@pytest.mark.parametrize("fields", [
    dict(content_size=10, content_chunks=0), dict(content_size=0, content_chunks=1),
    dict(content_size=2, content_chunks=3), dict(ids_size=-8, ids_chunks=0),
])
def test_an_inconsistent_header_is_named(fields):
    header = transfer_pb2.TensorHeader(name="h", **fields)
    _join_fails([[transfer_pb2.TransferPiece(header=header), None]], "Tensor 'h'", "header must")


def test_a_header_announcing_more_than_its_dtype_and_shape_is_named():
    header = transfer_pb2.TensorHeader(name="h", dtype=tensor_pb2.DT_FLOAT32, shape=[4],
                                       content_size=1 << 40, content_chunks=1)
    _join_fails([[transfer_pb2.TransferPiece(header=header), None]], "Tensor 'h'",
                "must announce 16 content and 0 ids bytes", f"content_size={1 << 40}")


def test_an_empty_piece_is_rejected():
    _join_fails([[transfer_pb2.TransferPiece(), None]], "header or a chunk")


def test_a_chunk_of_another_tensor_is_named():
    pieces = _split_pieces()
    pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 2)][0].chunk.tensor = "x"
    _join_fails(pieces, "Tensor 'w'", "content[2] of 4 is missing", "of tensor 'x'")


@pytest.mark.parametrize("raw, message", [
    (b"\x0a\x05abc", "cut short: a field announces 5 bytes"),
    (b"\x0a", "unterminated varint"),
    (b"\x0a\x00\x0a\x00", "once each. Received: tag 10"),
    (b"\x1a\x00", "once each. Received: tag 26"),
    (b"\x0a\x03\xff\xff\xff", "must be a TransferMessage"),
])
def test_bytes_that_are_not_a_frame_are_named(raw, message):
    with pytest.raises(PayloadError, match=message):
        chunking.decode_frame(raw)


def test_a_payload_that_does_not_match_its_chunks_is_named():
    (frame,) = chunking.split_tensors([_wire(np.float32, "small", False)], codec="none")
    raw = chunking.encode_frame(chunking.Frame(frame.message, [bytes(frame.data[0])[:-4]]))
    with pytest.raises(PayloadError, match="chunk content\\[0\\] announces 48 bytes"):
        chunking.decode_frame(raw)
    raw = chunking.encode_frame(chunking.Frame(frame.message, [bytes(frame.data[0]) + b"!"]))
    with pytest.raises(PayloadError, match="chunks announce 48 bytes. Received: a payload of 49"):
        chunking.decode_frame(raw)


@pytest.fixture
def sink():
    """A loopback client-streaming service that joins the frames it receives (bytes, as a
    PServer's streams do) and answers with the headers of the tensors it rebuilt; a
    `PayloadError` becomes INVALID_ARGUMENT."""
    received = []

    def push(request_iterator, context):
        joiner = joining.TensorJoiner()
        try:
            for raw in request_iterator:
                joiner.add(chunking.decode_frame(raw))
            tensors = joiner.finish()
        except PayloadError as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        received.extend(tensors)
        return transfer_pb2.TransferMessage(pieces=[
            transfer_pb2.TransferPiece(header=transfer_pb2.TensorHeader(name=t.name))
            for t in tensors])

    handler = grpc.method_handlers_generic_handler("elastic_keras.test.Sink", {
        "Push": grpc.stream_unary_rpc_method_handler(
            push, response_serializer=transfer_pb2.TransferMessage.SerializeToString)})
    server, port = rpc.create_server([lambda s: s.add_generic_rpc_handlers((handler,))])
    channel = rpc.create_channel(f"127.0.0.1:{port}", service="elastic_keras.test.Sink",
                                 deadline_s=30)
    call = channel.stream_unary("/elastic_keras.test.Sink/Push",
                                response_deserializer=transfer_pb2.TransferMessage.FromString)
    yield call, received
    channel.close()
    server.stop(None)


def test_a_stream_crosses_grpc(sink):
    call, received = sink
    wire = [_wire(np.float32, "chunks_and_remainder", True), _wire(np.int64, "small", False),
            _wire(np.float16, "empty", False)]
    frames = chunking.split_tensors(wire, codec="auto", chunk_bytes=CHUNK)
    reply = call(chunking.encode_frame(f) for f in frames)
    assert [p.header.name for p in reply.pieces] == ["emb", "w", "w"]
    _same(received, wire)


def test_a_corrupt_chunk_rejects_the_whole_call(sink):
    call, received = sink
    pieces = _split_pieces("snappy")
    piece = pieces[_chunk_at(pieces, "w", transfer_pb2.CHUNK_CONTENT, 3)]
    piece[1] = bytes(piece[1][:-1]) + bytes([piece[1][-1] ^ 0x10])
    message = transfer_pb2.TransferMessage(pieces=[p for p, _ in pieces])
    frame = chunking.Frame(message, [d for p, d in pieces if p.HasField("chunk")])
    with pytest.raises(grpc.RpcError) as info:
        call(iter([chunking.encode_frame(frame)]))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "Tensor 'w': chunk content[3] fails its checksum" in info.value.details()
    assert received == []


# ---------------------------------------------------------------- transfer dtypes

PRECISION = {"float16": 2.0**-11, "bfloat16": 2.0**-8}


@pytest.mark.parametrize("name", list(transfer_dtype.TRANSFER_DTYPES))
@pytest.mark.parametrize("source", [np.float32, np.float64, np.float16, ml_dtypes.bfloat16])
def test_floats_travel_at_half_size_within_precision(name, source):
    values = (rng.standard_normal(10_000) * 100).astype(source)
    sent = transfer_dtype.to_transfer_dtype(values, name)
    assert sent.dtype == transfer_dtype.TRANSFER_DTYPES[name]
    back = transfer_dtype.from_transfer_dtype(tensor_codec.decode(tensor_codec.encode("g", sent)))
    assert back.dtype == np.float32
    expected = values.astype(np.float64)
    np.testing.assert_allclose(back, expected, rtol=PRECISION[name], atol=0)


@pytest.mark.parametrize("name", [None, *transfer_dtype.TRANSFER_DTYPES])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integers_are_untouched(name, dtype):
    values = np.arange(-5, 5, dtype=dtype)
    assert transfer_dtype.to_transfer_dtype(values, name) is values
    assert transfer_dtype.from_transfer_dtype(values) is values


def test_slices_cast_their_values_and_keep_their_ids():
    slices = tensor_codec.Slices(np.ones((2, 3), np.float32), np.array([7, 9]), (0, 3))
    sent = transfer_dtype.to_transfer_dtype(slices, "bfloat16")
    assert sent.values.dtype == ml_dtypes.bfloat16 and sent.ids is slices.ids
    back = transfer_dtype.from_transfer_dtype(sent)
    assert back.values.dtype == np.float32 and back.dense_shape == (0, 3)


def test_no_transfer_dtype_and_float32_back_copy_nothing():
    values = np.ones(4, np.float32)
    assert transfer_dtype.to_transfer_dtype(values, None) is values
    assert transfer_dtype.from_transfer_dtype(values) is values


def test_float16_overflows_to_inf_and_bfloat16_does_not():
    values = np.array([1e5, -1e30], np.float32)
    with pytest.warns(RuntimeWarning, match="overflow"):
        assert np.isinf(transfer_dtype.to_transfer_dtype(values, "float16")).all()
    back = transfer_dtype.from_transfer_dtype(transfer_dtype.to_transfer_dtype(values, "bfloat16"))
    np.testing.assert_allclose(back, values, rtol=2.0**-8)


def test_bad_transfer_dtypes_are_rejected():
    with pytest.raises(ConfigError, match="Received: transfer_dtype='int8'"):
        transfer_dtype.to_transfer_dtype(np.ones(2), "int8")
    with pytest.raises(ConfigError, match="Received: dtype=int32"):
        transfer_dtype.from_transfer_dtype(np.ones(2), np.int32)
