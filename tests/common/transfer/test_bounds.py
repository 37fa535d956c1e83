"""Bounded receiving: sizes a peer announces are checked before anything is allocated."""

import numpy as np
import pytest

from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.transfer import chunking, compression, joining, tensor_stream
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.common.transfer.tensor_stream import TransferOptions
from elastic_keras.proto import pserver_pb2, tensor_pb2, transfer_pb2

MiB = 1 << 20


@pytest.fixture
def no_big_allocation(monkeypatch):
    """Fails the test if numpy or a codec is asked for a buffer over 64 MiB."""
    empty = np.empty

    def guarded_empty(shape, *args, **kwargs):
        assert np.prod(shape) <= 64 * MiB, f"allocated {shape}"
        return empty(shape, *args, **kwargs)

    def guarded_bytearray(size=0):
        assert size <= 64 * MiB, f"allocated {size} bytes"
        return bytearray(size)

    monkeypatch.setattr(joining.np, "empty", guarded_empty)
    monkeypatch.setattr(compression, "bytearray", guarded_bytearray, raising=False)


def _announcing_frame(raw_size, data, codec="lz4", chunks=1):
    """A frame of one float32 tensor of `raw_size` bytes whose first chunk is `data`."""
    message = transfer_pb2.TransferMessage()
    header = message.pieces.add().header
    header.name, header.dtype = "w", tensor_pb2.DT_FLOAT32
    header.shape.append(raw_size // 4)
    header.content_size, header.content_chunks = raw_size, chunks
    chunk = message.pieces.add().chunk
    chunk.tensor, chunk.field, chunk.index, chunk.codec = "w", transfer_pb2.CHUNK_CONTENT, 0, codec
    chunk.raw_size, chunk.size = raw_size // chunks, len(data)
    chunk.checksum = chunking.checksum(data)
    return chunking.decode_frame(chunking.encode_frame(chunking.Frame(message, [data])))


def test_a_1_mib_lz4_chunk_announcing_256_mib_is_refused_before_allocating(no_big_allocation):
    frame = _announcing_frame(256 * MiB, bytes(MiB))
    with pytest.raises(PayloadError, match="lz4 data must decompress to 268435456 bytes, as "
                       "announced, and 1048576 bytes of it decompress to at most 267386944"):
        joining.TensorJoiner().add(frame)


def test_a_codec_checks_the_announced_size_before_allocating(no_big_allocation):
    for name in ("lz4", "snappy", "none"):
        with pytest.raises(PayloadError, match="must decompress to 268435456 bytes"):
            compression.get_codec(name).decompress(bytes(MiB), 256 * MiB)
    data = compression.get_codec("lz4").compress(bytes(4096))
    with pytest.raises(PayloadError, match="at most 1000 bytes here"):
        compression.get_codec("lz4").decompress(data, 4096, limit=1000)
    assert compression.get_codec("lz4").decompress(data, 4096, limit=4096) == bytes(4096)


def test_the_joiner_refuses_headers_above_its_limit_before_allocating(no_big_allocation):
    frame = _announcing_frame(256 * MiB, bytes(4 * MiB), chunks=64)
    with pytest.raises(PayloadError, match="at most 1048576 bytes of tensors. Received: "
                       "268435456 bytes"):
        joining.TensorJoiner(max_bytes=MiB).add(frame)


def test_a_push_stream_is_bounded_while_it_is_read():
    options = TransferOptions("none", 4096)
    tensors = options.encode([("w", np.ones(100_000, np.float32))])  # 400 kB: ~100 parts
    parts = list(tensor_stream.push_parts(pserver_pb2.PushHeader(worker_id=1, sequence=1),
                                          tensors, options))
    read = []

    def stream():
        for part in parts:
            read.append(part)
            yield part

    # The header announces 400 kB of tensors: refused with the first part.
    with pytest.raises(PayloadError, match="at most 50000 bytes of tensors. Received: 400000"):
        tensor_stream.read_push(stream(), max_bytes=50_000)
    assert len(read) == 1
    # The parts themselves (400 kB of chunks, and their messages) are counted as they come.
    read.clear()
    with pytest.raises(PayloadError, match="at most 400001 bytes. Received: 4"):
        tensor_stream.read_push(stream(), max_bytes=400_001)
    assert 1 < len(read) <= len(parts)
    header, got = tensor_stream.read_push(parts, max_bytes=500_000)
    assert header.sequence == 1 and len(got) == 1


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_push_bytes=0), "--max-push-bytes must be a positive integer. Received: 0"),
    (dict(max_embedding_dim=-1), "--max-embedding-dim must be a positive integer"),
    (dict(non_finite_gradients="ignore"),
     "--non-finite-gradients must be one of fail, skip. Received: 'ignore'"),
    (dict(max_non_finite_pushes=-1), "--max-non-finite-pushes must be zero or more"),
])
def test_bad_limits_are_config_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PayloadLimits(**kwargs)
