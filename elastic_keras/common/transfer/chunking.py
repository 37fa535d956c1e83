"""Wire tensors to and from a stream of compressed, checksummed chunks, framed for gRPC.

`split_tensors` turns wire tensors (`tensor_codec.WireTensor`s, whose bytes are views of
arrays, or `Tensor` messages) into `Frame`s: a stream message and the bytes of its chunks.
`encode_frame` makes a frame the bytes a streamed RPC sends (a `TransferFrame`), and
`decode_frame` reads them back without copying; `join_tensors` (or a `TensorJoiner` fed one
frame at a time) rebuilds the tensors. The stream is the format of
`protos/elastic_keras/proto/transfer.proto`: per tensor, a `TensorHeader`, then its content
chunks, then its ids chunks (sparse tensors), each chunk at most `chunk_bytes` of raw data,
compressed on its own (see `compression`) and carrying the XXH3-64 checksum of the bytes
sent, their size and its raw size.

A small tensor is one chunk, and many small tensors share one stream message. A stream
message holds at most about `chunk_bytes` of chunk data (one chunk when chunks are large).

Why frames: a chunk's bytes never enter a protobuf message. A sender copies each chunk
once, from its array into the frame (`encode_frame`); a receiver checks it where gRPC put it
and copies it once, into the tensor's buffer, or not at all when one uncompressed chunk is
the whole tensor (its array is then a read-only view of the frame). Putting the bytes in a
`bytes` field instead costs two more copies on each side, which for a 50 MB pull made the
stream about twice as slow as gRPC moving the same bytes.

Joining checks what the transport could get wrong: every chunk's checksum, codec and size,
and that no chunk is missing, duplicated or out of order. It raises `PayloadError` naming the
tensor and the chunk, and gives nothing back for a stream with any fault. The sizes a header
announces are checked against its dtype and shape before a buffer is allocated for them;
`tensor_codec.decode` checks the rest, as for any tensor.

Example:

    >>> import numpy as np
    >>> from elastic_keras.common.transfer import tensor_codec
    >>> wire = [tensor_codec.wire_tensor("w", np.zeros((1000, 1000), np.float32))]
    >>> sent = [encode_frame(f) for f in split_tensors(wire, "none", chunk_bytes=1 << 20)]
    >>> (joined,) = join_tensors(decode_frame(raw) for raw in sent)
    >>> len(sent), tensor_codec.decode(joined).shape
    (4, (1000, 1000))
"""

import typing

import numpy as np
import xxhash
from google.protobuf.message import DecodeError

from elastic_keras.common.transfer import compression, tensor_codec
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.proto import transfer_pb2

DEFAULT_CHUNK_BYTES = 4 << 20

_FIELDS = (transfer_pb2.CHUNK_CONTENT, transfer_pb2.CHUNK_IDS)
_FIELD_NAMES = {transfer_pb2.CHUNK_CONTENT: "content", transfer_pb2.CHUNK_IDS: "ids"}
# The two fields of a `TransferFrame` as protobuf tags: field number << 3 | 2 (bytes).
_META_TAG, _PAYLOAD_TAG = 1 << 3 | 2, 2 << 3 | 2
_EMPTY = memoryview(b"")


class Frame(typing.NamedTuple):
    """A stream message (with a `pieces` field) and the bytes of its chunks, one buffer per
    chunk piece in the order of its pieces."""

    message: object
    data: list


def checksum(data):
    """The checksum a chunk carries: XXH3-64 of `data` (any bytes-like object)."""
    return xxhash.xxh3_64_intdigest(data)


def _chunk_count(size, chunk_bytes):
    return -(-size // chunk_bytes)


def split_tensors(tensors, codec="auto", chunk_bytes=DEFAULT_CHUNK_BYTES,
                  message_type=transfer_pb2.TransferMessage):
    """An iterator of the `Frame`s that carry `tensors`, made lazily: one chunk is
    compressed at a time, as the iterator is consumed (e.g. by gRPC as it sends).

    Args:
        tensors: `tensor_codec.WireTensor`s (from `tensor_codec.wire_tensor`), whose chunks
            are views of the arrays until `encode_frame` copies them, or `Tensor` messages.
        codec: a name in `compression.CODEC_NAMES`, or a `compression.Codec`.
        chunk_bytes: the most raw bytes of one field of one tensor in one chunk.
        message_type: the stream's message class: `TransferMessage`, or an RPC's own message
            with a `repeated TransferPiece pieces` field. Only `pieces` is filled, in place:
            the caller may set the message's other fields on any frame's message (e.g. the
            first's) before encoding it.

    Raises:
        ConfigError: unknown codec, or `chunk_bytes` < 1.
    """
    codec = compression.get_codec(codec)
    if not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ConfigError(f"chunk_bytes must be an integer >= 1. Received: {chunk_bytes!r}")
    return _split(tensors, codec, chunk_bytes, message_type)


def _split(tensors, codec, chunk_bytes, message_type):
    frame, frame_bytes = Frame(message_type(), []), 0
    for tensor in tensors:
        # Every read of a message's bytes field copies it: read each once.
        fields = ((transfer_pb2.CHUNK_CONTENT, _bytes_view(tensor.content)),
                  (transfer_pb2.CHUNK_IDS, _bytes_view(tensor.ids)))
        header = frame.message.pieces.add().header
        header.name = tensor.name
        header.dtype = tensor.dtype
        header.shape.extend(tensor.shape)
        header.dense_shape.extend(tensor.dense_shape)
        header.content_size = len(fields[0][1])
        header.content_chunks = _chunk_count(len(fields[0][1]), chunk_bytes)
        header.ids_size = len(fields[1][1])
        header.ids_chunks = _chunk_count(len(fields[1][1]), chunk_bytes)
        for field, raw in fields:
            for index in range(_chunk_count(len(raw), chunk_bytes)):
                part = raw[index * chunk_bytes:(index + 1) * chunk_bytes]
                codec_name, data = codec.pack(part)
                if frame_bytes and frame_bytes + len(data) > chunk_bytes:
                    yield frame
                    frame, frame_bytes = Frame(message_type(), []), 0
                chunk = frame.message.pieces.add().chunk
                chunk.tensor = tensor.name
                chunk.field = field
                chunk.index = index
                chunk.codec = codec_name
                chunk.checksum = checksum(data)
                chunk.raw_size = len(part)
                chunk.size = len(data)
                frame.data.append(data)
                frame_bytes += len(data)
    if frame.message.pieces:
        yield frame


def one_frame(tensors, codec="auto", chunk_bytes=DEFAULT_CHUNK_BYTES,
              message_type=transfer_pb2.TransferMessage):
    """Every chunk of `tensors` in one `Frame`, for a unary RPC: the chunks `split_tensors`
    makes (same arguments), however many, in one message."""
    whole = Frame(message_type(), [])
    for frame in split_tensors(tensors, codec, chunk_bytes, message_type):
        whole.message.pieces.extend(frame.message.pieces)
        whole.data.extend(frame.data)
    return whole


def _bytes_view(data):
    """A flat byte `memoryview` of `data` (so that `len` counts bytes and slicing copies
    nothing)."""
    view = memoryview(data)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def encode_frame(frame):
    """The bytes of `frame` as a `TransferFrame`: its message serialized, then its chunks'
    bytes, copied once."""
    meta = frame.message.SerializeToString()
    payload = sum(len(data) for data in frame.data)
    return b"".join([bytes([_META_TAG]), _varint(len(meta)), meta,
                     bytes([_PAYLOAD_TAG]), _varint(payload), *frame.data])


def decode_frame(raw, message_type=transfer_pb2.TransferMessage):
    """The `Frame` in the bytes of a `TransferFrame`; its chunks' bytes are views of `raw`.

    Raises:
        PayloadError: `raw` is not a `TransferFrame`, its message is not a `message_type`,
            or its payload does not hold exactly the sizes its chunks announce.
    """
    view = memoryview(raw)
    fields = {}
    position = 0
    while position < len(view):
        tag, position = _read_varint(view, position)
        if tag not in (_META_TAG, _PAYLOAD_TAG) or tag in fields:
            raise PayloadError("A transfer frame holds its message (field 1) and its payload "
                               f"(field 2), once each. Received: tag {tag}")
        size, position = _read_varint(view, position)
        if position + size > len(view):
            raise PayloadError(f"A transfer frame is cut short: a field announces {size} "
                               f"bytes. Received: {len(view) - position}")
        fields[tag] = view[position:position + size]
        position += size
    try:
        message = message_type.FromString(fields.get(_META_TAG, _EMPTY))
    except DecodeError as exc:
        raise PayloadError(f"A transfer frame's message must be a {message_type.__name__}. "
                           f"Received: undecodable bytes ({exc})") from exc
    payload = fields.get(_PAYLOAD_TAG, _EMPTY)
    data, offset = [], 0
    for piece in message.pieces:
        if piece.WhichOneof("piece") == "chunk":
            size = piece.chunk.size
            if size < 0 or offset + size > len(payload):
                raise PayloadError(
                    f"Tensor {piece.chunk.tensor!r}: chunk {_label(piece.chunk)} announces "
                    f"{size} bytes; its frame's payload has {len(payload) - offset} left. "
                    f"Received: size={size}")
            data.append(payload[offset:offset + size])
            offset += size
    if offset != len(payload):
        raise PayloadError(f"A transfer frame's chunks announce {offset} bytes. Received: a "
                           f"payload of {len(payload)}")
    return Frame(message, data)


def _varint(value):
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_varint(view, position):
    value, shift = 0, 0
    while position < len(view) and shift < 64:
        byte = view[position]
        position += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, position
        shift += 7
    raise PayloadError("A transfer frame is cut short or malformed. Received: an unterminated "
                       "varint")


def _label(chunk):
    return f"{_FIELD_NAMES.get(chunk.field, chunk.field)}[{chunk.index}]"


def join_tensors(frames):
    """The `WireTensor`s carried by a whole stream of `Frame`s, in the order they were sent.

    Raises:
        PayloadError: a chunk is corrupt, missing, duplicated or out of order, or the stream
            ends inside a tensor. The message names the tensor and the chunk.
    """
    joiner = TensorJoiner()
    for frame in frames:
        joiner.add(frame)
    return joiner.finish()


class _Field:
    """One field of the tensor being received: its announced chunks and what came so far.

    One uncompressed chunk that is the whole field is kept as it came (a read-only view of
    its frame). Otherwise chunks are decompressed straight into one buffer of the announced
    size: a writable `memoryview` of an uninitialised numpy array, which every byte of a
    complete field overwrites, so it is not zero-filled first.
    """

    def __init__(self, kind, size, count):
        self.kind, self.size, self.count = kind, size, count
        self.received, self.next_index = 0, 0
        self.buffer = None

    @property
    def label(self):
        return f"{_FIELD_NAMES[self.kind]}[{self.next_index}] of {self.count}"

    def take(self, codec, data, raw_size):
        """Decompresses one chunk's `data` (raises `PayloadError` on a fault)."""
        if self.count == 1 and codec.name == "none":
            if len(data) != raw_size:
                raise PayloadError(f"none data must decompress to {raw_size} bytes. "
                                   f"Received: {len(data)} bytes")
            self.buffer = data
        else:
            if self.buffer is None:
                self.buffer = memoryview(np.empty(self.size, np.uint8))
            codec.decompress_into(data, self.buffer[self.received:self.received + raw_size])
        self.received += raw_size
        self.next_index += 1

    def value(self):
        return b"" if self.buffer is None else self.buffer


class TensorJoiner:
    """Rebuilds `WireTensor`s from `Frame`s fed one at a time, checking every chunk.

    Feed every frame of a stream to `add`, then call `finish` once. A streaming servicer
    may read its own fields of each frame's message (e.g. a request-level one) beside `add`.
    The tensors' `content` and `ids` are `memoryview`s, filled chunk by chunk.

    Example:

        joiner = TensorJoiner()
        for raw in request_iterator:
            joiner.add(decode_frame(raw))
        tensors = joiner.finish()
    """

    def __init__(self):
        self._tensors = []
        self._header = None   # of the tensor being received
        self._fields = ()     # its content and ids _Fields
        self._pending = []    # those of them still expecting chunks, in stream order
        self._last = None     # the name of the last tensor completed

    def add(self, frame):
        """Takes the pieces of one frame. Raises `PayloadError` on any fault."""
        pieces = frame.message.pieces
        chunks = sum(1 for piece in pieces if piece.WhichOneof("piece") == "chunk")
        if chunks != len(frame.data):
            raise PayloadError(f"A frame carries the bytes of each of its {chunks} chunks. "
                               f"Received: {len(frame.data)} buffers")
        data = iter(frame.data)
        for piece in pieces:
            kind = piece.WhichOneof("piece")
            if kind == "header":
                self._start(piece.header)
            elif kind == "chunk":
                self._take(piece.chunk, next(data))
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
        expected = tensor_codec.byte_sizes(header)  # before allocating what it announces
        announced = (fields[0][1], fields[1][1])
        if announced != expected:
            raise self._error(
                f"the header must announce {expected[0]} content and {expected[1]} ids "
                f"bytes for its dtype and shape",
                f"content_size={announced[0]}, ids_size={announced[1]}", name=header.name)
        self._header = transfer_pb2.TensorHeader()
        self._header.CopyFrom(header)  # keeps no reference into the caller's message
        self._fields = [_Field(*field) for field in fields]
        self._pending = [field for field in self._fields if field.count]
        if not self._pending:
            self._complete()

    def _take(self, chunk, data):
        if chunk.field not in _FIELD_NAMES:
            raise self._error("a chunk's field must be CHUNK_CONTENT or CHUNK_IDS",
                              f"field={chunk.field}", name=chunk.tensor)
        where = f"chunk {_label(chunk)}"
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
        if len(data) != chunk.size:
            raise self._error(f"{where} announces {chunk.size} bytes", f"{len(data)} bytes")
        sent = checksum(data)
        if sent != chunk.checksum:
            raise self._error(f"{where} fails its checksum (corrupted in transit)",
                              f"XXH3-64 0x{chunk.checksum:016x} sent, 0x{sent:016x} of the data")
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
        self._tensors.append(tensor_codec.WireTensor(
            header.name, header.dtype, tuple(header.shape), content, ids,
            tuple(header.dense_shape)))
        self._header, self._fields, self._pending, self._last = None, (), [], header.name
