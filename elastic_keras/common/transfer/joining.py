"""Checking the chunks of a transfer stream and rebuilding the tensors they carry.

A receiver decodes each frame it gets (`chunking.decode_frame`) and feeds it to a
`TensorJoiner`, or hands a whole stream of frames to `join_tensors`. Joining checks what the
transport could get wrong: every chunk's checksum, codec and size, and that no chunk is
missing, duplicated or out of order. It raises `PayloadError` naming the tensor and the
chunk, and gives nothing back for a stream with any fault. The sizes a header announces are
checked against its dtype and shape before a buffer is allocated for them;
`tensor_codec.decode` checks the rest, as for any tensor.

Example:

    >>> import numpy as np
    >>> from elastic_keras.common.transfer import chunking, tensor_codec
    >>> wire = [tensor_codec.wire_tensor("w", np.zeros((1000, 1000), np.float32))]
    >>> sent = [chunking.encode_frame(f)
    ...         for f in chunking.split_tensors(wire, "none", chunk_bytes=1 << 20)]
    >>> (joined,) = join_tensors(chunking.decode_frame(raw) for raw in sent)
    >>> tensor_codec.decode(joined).shape
    (1000, 1000)
"""

import numpy as np

from elastic_keras.common.errors import PayloadError
from elastic_keras.common.transfer import compression, tensor_codec
from elastic_keras.common.transfer.chunking import FIELD_NAMES, checksum, chunk_label
from elastic_keras.proto import transfer_pb2

# The fields of a tensor, in the order their chunks travel.
_FIELDS = (transfer_pb2.CHUNK_CONTENT, transfer_pb2.CHUNK_IDS)


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
        return f"{FIELD_NAMES[self.kind]}[{self.next_index}] of {self.count}"

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

    `max_bytes` (None: no limit) bounds the raw bytes of all the stream's tensors together:
    a header announcing more is refused before anything is allocated for it.

    Example:

        joiner = TensorJoiner()
        for raw in request_iterator:
            joiner.add(chunking.decode_frame(raw))
        tensors = joiner.finish()
    """

    def __init__(self, max_bytes=None):
        self._max_bytes = max_bytes
        self._announced = 0   # raw bytes the headers so far announced
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
            label = FIELD_NAMES[kind]
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
        self._announced += sum(announced)
        if self._max_bytes is not None and self._announced > self._max_bytes:
            raise self._error(f"a stream may carry at most {self._max_bytes} bytes of tensors",
                              f"{self._announced} bytes up to this tensor", name=header.name)
        self._header = transfer_pb2.TensorHeader()
        self._header.CopyFrom(header)  # keeps no reference into the caller's message
        self._fields = [_Field(*field) for field in fields]
        self._pending = [field for field in self._fields if field.count]
        if not self._pending:
            self._complete()

    def _take(self, chunk, data):
        if chunk.field not in FIELD_NAMES:
            raise self._error("a chunk's field must be CHUNK_CONTENT or CHUNK_IDS",
                              f"field={chunk.field}", name=chunk.tensor)
        where = f"chunk {chunk_label(chunk)}"
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
            codec = compression.wire_codec(chunk.codec)
            codec.check_raw_size(chunk.size, chunk.raw_size)  # before allocating
            field.take(codec, data, chunk.raw_size)
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
