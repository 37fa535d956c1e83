"""Wire tensors to and from a stream of compressed, checksummed chunks.

`split_tensors` turns encoded `Tensor` messages (or `tensor_codec.WireTensor`s, whose bytes
are views of arrays) into stream messages for a gRPC streaming call; `join_tensors` (or a
`TensorJoiner` fed one message at a time) turns them back. The stream is the format of
`protos/elastic_keras/proto/transfer.proto`: per tensor, a `TensorHeader`, then its content
chunks, then its ids chunks (sparse tensors), each chunk at most `chunk_bytes` of raw data,
compressed on its own (see `compression`) and carrying the CRC-32C of the bytes sent and its
raw size.

A small tensor is one chunk, and many small tensors share one stream message. A stream
message holds at most about `chunk_bytes` of chunk data (one chunk when chunks are large).

Joining checks what the transport could get wrong: every chunk's checksum, codec and size,
and that no chunk is missing, duplicated or out of order. It raises `PayloadError` naming the
tensor and the chunk, and gives nothing back for a stream with any fault. It does not check
that the bytes fit the dtype and shape: `tensor_codec.decode` does that, as for any tensor
(except that a joiner filling buffers checks the sizes a header announces against its dtype
and shape before allocating them).

Example:

    >>> import numpy as np
    >>> from elastic_keras.common import tensor_codec
    >>> wire = [tensor_codec.encode("w", np.zeros((1000, 1000), np.float32))]
    >>> messages = list(split_tensors(wire, codec="none", chunk_bytes=1 << 20))
    >>> len(messages), join_tensors(messages) == wire
    (4, True)
"""

import google_crc32c
import numpy as np

from elastic_keras.common import compression, tensor_codec
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.proto import tensor_pb2, transfer_pb2

DEFAULT_CHUNK_BYTES = 4 << 20

_FIELDS = (transfer_pb2.CHUNK_CONTENT, transfer_pb2.CHUNK_IDS)
_FIELD_NAMES = {transfer_pb2.CHUNK_CONTENT: "content", transfer_pb2.CHUNK_IDS: "ids"}


def _chunk_count(size, chunk_bytes):
    return -(-size // chunk_bytes)


def split_tensors(tensors, codec="auto", chunk_bytes=DEFAULT_CHUNK_BYTES,
                  message_type=transfer_pb2.TransferMessage):
    """An iterator of the stream messages that carry `tensors`, made lazily: one chunk is
    compressed at a time, as the iterator is consumed (e.g. by gRPC as it sends).

    Args:
        tensors: `tensor_pb2.Tensor` messages (from `tensor_codec.encode`), or
            `tensor_codec.WireTensor`s (from `tensor_codec.wire_tensor`), which save copying
            each tensor's bytes whole: only chunks are copied, into the messages.
        codec: a name in `compression.CODEC_NAMES`, or a `compression.Codec`.
        chunk_bytes: the most raw bytes of one field of one tensor in one chunk.
        message_type: the stream's message class: `TransferMessage`, or an RPC's own message
            with a `repeated TransferPiece pieces` field. Only `pieces` is filled, in place:
            the caller may set the message's other fields on any message yielded (e.g. the
            first), or send a message of its own after the last.

    Raises:
        ConfigError: unknown codec, or `chunk_bytes` < 1.
    """
    codec = compression.get_codec(codec)
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ConfigError(f"chunk_bytes must be an integer >= 1. Received: {chunk_bytes!r}")
    return _split(tensors, codec, chunk_bytes, message_type)


def _split(tensors, codec, chunk_bytes, message_type):
    message, message_bytes = message_type(), 0
    for tensor in tensors:
        # Every read of a bytes field copies it out of the message: read each once.
        fields = ((transfer_pb2.CHUNK_CONTENT, _bytes_view(tensor.content)),
                  (transfer_pb2.CHUNK_IDS, _bytes_view(tensor.ids)))
        header = message.pieces.add().header
        header.name = tensor.name
        header.dtype = tensor.dtype
        header.shape.extend(tensor.shape)
        header.dense_shape.extend(tensor.dense_shape)
        header.content_size = len(fields[0][1])
        header.content_chunks = _chunk_count(len(fields[0][1]), chunk_bytes)
        header.ids_size = len(fields[1][1])
        header.ids_chunks = _chunk_count(len(fields[1][1]), chunk_bytes)
        for field, raw in fields:
            count = _chunk_count(len(raw), chunk_bytes)
            view = memoryview(raw)
            for index in range(count):
                # A single chunk is `raw` itself, so codec "none" copies nothing here.
                part = raw if count == 1 else view[index * chunk_bytes:(index + 1) * chunk_bytes]
                codec_name, data = codec.pack(part)
                if message_bytes and message_bytes + len(data) > chunk_bytes:
                    yield message
                    message, message_bytes = message_type(), 0
                chunk = message.pieces.add().chunk
                chunk.tensor = tensor.name
                chunk.field = field
                chunk.index = index
                chunk.codec = codec_name
                chunk.crc32c = google_crc32c.value(data)
                chunk.raw_size = len(part)
                chunk.data = data
                message_bytes += len(data)
    if message.pieces:
        yield message


def _bytes_view(data):
    """`data` itself when `bytes`, else a flat byte view of it (so `len` counts bytes)."""
    return data if isinstance(data, bytes) else memoryview(data).cast("B")


def join_tensors(messages):
    """The `Tensor`s carried by a whole stream of messages, in the order they were sent.

    Args:
        messages: stream messages with a `pieces` field (`TransferMessage`s, or an RPC's own).

    Raises:
        PayloadError: a chunk is corrupt, missing, duplicated or out of order, or the stream
            ends inside a tensor. The message names the tensor and the chunk.
    """
    joiner = TensorJoiner()
    for message in messages:
        joiner.add(message)
    return joiner.finish()


class _Field:
    """One field of the tensor being received: its announced chunks and what came so far.

    With `into_buffer`, chunks are decompressed straight into one buffer of the announced
    size; else each chunk's bytes are kept and joined at the end. The buffer is a writable
    `memoryview` of an uninitialised numpy array: every byte is written by a chunk, so it is
    not zero-filled first (as a `bytearray` would be: for a 50 MB pull, a sizeable part of
    the joiner's time).
    """

    def __init__(self, kind, size, count, into_buffer):
        self.kind, self.size, self.count = kind, size, count
        self.parts, self.received, self.next_index = [], 0, 0
        self.buffer = memoryview(np.empty(size, np.uint8)) if into_buffer else None

    @property
    def label(self):
        return f"{_FIELD_NAMES[self.kind]}[{self.next_index}] of {self.count}"

    def take(self, codec, data, raw_size):
        """Decompresses one chunk's `data` (raises `PayloadError` on a fault)."""
        if self.buffer is None:
            self.parts.append(codec.decompress(data, raw_size))
        else:
            end = self.received + raw_size
            codec.decompress_into(data, self.buffer[self.received:end])
        self.received += raw_size
        self.next_index += 1

    def value(self):
        if self.buffer is not None:
            return self.buffer
        return self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)


class TensorJoiner:
    """Rebuilds `Tensor`s from stream messages fed one at a time, checking every chunk.

    Feed every message of a stream to `add`, then call `finish` once. A streaming servicer
    may read its own fields of each message (e.g. a request-level one) beside `add`.

    Args:
        messages: give back `Tensor` messages (True), or `tensor_codec.WireTensor`s (False)
            whose `content` and `ids` are writable `memoryview`s filled chunk by chunk: the
            tensor's bytes are written once, not joined and copied into a message (and
            copied out again when read).

    Example:

        joiner = TensorJoiner()
        for message in request_iterator:
            joiner.add(message)
        tensors = joiner.finish()
    """

    def __init__(self, messages=True):
        self._messages = messages
        self._tensors = []
        self._header = None   # of the tensor being received
        self._fields = ()     # its content and ids _Fields
        self._pending = []    # those of them still expecting chunks, in stream order
        self._last = None     # the name of the last tensor completed

    def add(self, message):
        """Takes the pieces of one stream message. Raises `PayloadError` on any fault."""
        for piece in message.pieces:
            kind = piece.WhichOneof("piece")
            if kind == "header":
                self._start(piece.header)
            elif kind == "chunk":
                self._take(piece.chunk)
            else:
                raise PayloadError("A transfer piece must hold a header or a chunk. "
                                   "Received: an empty piece")

    def finish(self):
        """Returns the tensors received. Raises `PayloadError` if the stream ended inside one."""
        if self._header is not None:
            raise self._error(f"chunk {self._pending[0].label} is missing",
                              "the end of the stream")
        return self._tensors

    def _error(self, rule, received, name=None):
        name = self._header.name if name is None else name
        return PayloadError(f"Tensor {name!r}: {rule}. Received: {received}")

    def _start(self, header):
        if self._header is not None:
            raise self._error(f"chunk {self._pending[0].label} is missing",
                              f"the header of tensor {header.name!r}")
        fields = []
        for kind in _FIELDS:
            label = _FIELD_NAMES[kind]
            size = getattr(header, f"{label}_size")
            count = getattr(header, f"{label}_chunks")
            if size < 0 or count < 0 or (size == 0) != (count == 0) or count > size:
                raise self._error(
                    f"the header must announce between 1 and {label}_size {label} chunks, "
                    f"or 0 for 0 bytes", f"{label}_size={size}, {label}_chunks={count}",
                    name=header.name)
            fields.append((kind, size, count))
        if not self._messages:  # check before allocating what the header announces
            expected = tensor_codec.byte_sizes(header)
            announced = (fields[0][1], fields[1][1])
            if announced != expected:
                raise self._error(
                    f"the header must announce {expected[0]} content and {expected[1]} ids "
                    f"bytes for its dtype and shape",
                    f"content_size={announced[0]}, ids_size={announced[1]}", name=header.name)
        self._header = transfer_pb2.TensorHeader()
        self._header.CopyFrom(header)  # keeps no reference into the caller's message
        self._fields = [_Field(*field, into_buffer=not self._messages) for field in fields]
        self._pending = [field for field in self._fields if field.count]
        if not self._pending:
            self._complete()

    def _take(self, chunk):
        if chunk.field not in _FIELD_NAMES:
            raise self._error("a chunk's field must be CHUNK_CONTENT or CHUNK_IDS",
                              f"field={chunk.field}", name=chunk.tensor)
        where = f"chunk {_FIELD_NAMES[chunk.field]}[{chunk.index}]"
        if self._header is None:
            rule = (f"{where} came after the tensor's last chunk (duplicated or out of order)"
                    if chunk.tensor == self._last else f"{where} came before the tensor's header")
            raise self._error(rule, where, name=chunk.tensor)
        field = self._pending[0]
        if chunk.tensor != self._header.name:
            raise self._error(f"chunk {field.label} is missing",
                              f"{where} of tensor {chunk.tensor!r}")
        position = (_FIELDS.index(chunk.field), chunk.index)
        expected = (_FIELDS.index(field.kind), field.next_index)
        if position != expected:
            fault = ("duplicated or out of order" if position < expected
                     else "missing or out of order")
            raise self._error(f"expected chunk {field.label}: {fault}", where)
        remaining = field.size - field.received
        last = field.next_index == field.count - 1
        if not (0 < chunk.raw_size <= remaining) or (last and chunk.raw_size != remaining):
            rule = (f"{where}, the last, must hold the remaining {remaining} bytes" if last
                    else f"{where} must hold between 1 and {remaining} bytes")
            raise self._error(rule, f"raw_size={chunk.raw_size}")
        data = chunk.data  # one copy out of the message: read once
        crc = google_crc32c.value(data)
        if crc != chunk.crc32c:
            raise self._error(f"{where} fails its CRC-32C check (corrupted in transit)",
                              f"crc32c 0x{chunk.crc32c:08x} sent, 0x{crc:08x} of the data")
        try:
            field.take(compression.wire_codec(chunk.codec), data, chunk.raw_size)
        except PayloadError as exc:
            raise PayloadError(f"Tensor {self._header.name!r}: {where}: {exc}") from exc
        if field.next_index == field.count:
            self._pending.pop(0)
            if not self._pending:
                self._complete()

    def _complete(self):
        header = self._header
        content, ids = (field.value() for field in self._fields)
        if self._messages:
            self._tensors.append(tensor_pb2.Tensor(
                name=header.name, dtype=header.dtype, shape=header.shape,
                dense_shape=header.dense_shape, content=content, ids=ids))
        else:
            self._tensors.append(tensor_codec.WireTensor(
                header.name, header.dtype, tuple(header.shape), content, ids,
                tuple(header.dense_shape)))
        self._header, self._fields, self._pending, self._last = None, (), [], header.name
