"""Tensors over the PServer's streamed RPCs: the messages a sender makes and a receiver reads.

A streamed push is a sequence of `PushGradientsPart`s: the first carries the `PushHeader`
(worker, sequence, model version, assigned values), and the parts' pieces carry the
gradients as a transfer stream (see `chunking`). A streamed dense pull is a sequence of
`PullDensePart`s: the first carries `initialized` and `model_version`, the pieces the
shard's tensors. An embedding pull is answered with one `PullEmbeddingResponse`, its pieces
the rows. Each part travels as the bytes of a `TransferFrame` beside its chunks'
bytes: the RPCs send and receive those bytes as they are (see `rpc.add_servicer`). Reading
either checks every piece and gives back nothing for a stream with any fault
(`PayloadError`, which a shard answers with INVALID_ARGUMENT).

How tensors travel is a `TransferOptions`: the codec of each chunk, the chunk size, and the
transfer dtype, in which floating tensors cross the wire (`transfer_dtype`). Whatever was
sent, `decode_tensors` gives float16/bfloat16 values back as float32, so a parameter server
checks, accumulates and applies float32. Assigned values (non-trainable variables such as
batch-norm statistics) are state, not gradients: they travel unconverted.

Example:

    >>> import numpy as np
    >>> options = TransferOptions(compression="lz4", chunk_bytes=4096,
    ...                           transfer_dtype="bfloat16")
    >>> parts = list(push_parts(pserver_pb2.PushHeader(worker_id=1, sequence=7),
    ...                         options.encode([("w", np.ones(3000, np.float32))]), options))
    >>> header, tensors = read_push(parts)
    >>> header.sequence, decode_tensors(tensors)[0][1].dtype.name
    (7, 'float32')
"""

import dataclasses

from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.flags import flag
from elastic_keras.common.transfer import (
    chunking, compression, joining, tensor_codec, transfer_dtype,
)
from elastic_keras.proto import pserver_pb2

# The service whose streamed RPCs carry these frames (serve it with `rpc.add_servicer`).
PSERVER = pserver_pb2.DESCRIPTOR.services_by_name["PServer"]
FULL_PRECISION = "float32"
TRANSFER_DTYPE_NAMES = (FULL_PRECISION, *transfer_dtype.TRANSFER_DTYPES)
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1 << 10, 256 << 20
_REDUCED = frozenset(transfer_dtype.TRANSFER_DTYPES.values())


@dataclasses.dataclass(frozen=True)
class TransferOptions:
    """How one side sends tensors: `--compression`, `--chunk-bytes`, `--transfer-dtype`.

    The one declaration of these settings: the job's and the roles' configs hold one as
    their `transfer` field, and each field here is a flag of theirs, with its help (see
    `config`).

    Args:
        compression: a name in `compression.CODEC_NAMES`; "auto" compresses (with snappy)
            only the chunks that shrink.
        chunk_bytes: the most raw bytes of one tensor field in one chunk, from
            `MIN_CHUNK_BYTES` to `MAX_CHUNK_BYTES`.
        transfer_dtype: "float32" (send floats as they are), "float16" or "bfloat16".

    Raises:
        ConfigError: a value outside those, naming its flag, the rule and the value.

    Example:

        >>> TransferOptions(chunk_bytes=100)  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ConfigError: --chunk-bytes must be an integer from 1024 to 268435456. Received: 100
    """

    compression: str = flag(
        "auto", help="How gradients and pulled parameters are compressed, chunk by chunk: "
        "none, snappy, lz4, or auto (snappy, keeping only chunks it shrinks by 10% or more)."
    )
    chunk_bytes: int = flag(
        chunking.DEFAULT_CHUNK_BYTES, help="Pushes and pulls larger than this many bytes are "
        "split into chunks of at most this size, each compressed and checksummed on its own, "
        "and streamed."
    )
    transfer_dtype: str = flag(
        FULL_PRECISION, help="Precision of gradients, pulled parameters and embedding rows on "
        "the wire: float32 (as they are), float16 or bfloat16. The parameter servers keep "
        "float32."
    )

    def __post_init__(self):
        if self.compression not in compression.CODEC_NAMES:
            raise ConfigError(f"--compression must be one of "
                              f"{', '.join(compression.CODEC_NAMES)}. "
                              f"Received: {self.compression!r}")
        size = self.chunk_bytes
        if (not isinstance(size, int) or isinstance(size, bool)
                or not MIN_CHUNK_BYTES <= size <= MAX_CHUNK_BYTES):
            raise ConfigError(f"--chunk-bytes must be an integer from {MIN_CHUNK_BYTES} to "
                              f"{MAX_CHUNK_BYTES}. Received: {size!r}")
        if self.transfer_dtype not in TRANSFER_DTYPE_NAMES:
            raise ConfigError(
                f"--transfer-dtype must be one of {', '.join(TRANSFER_DTYPE_NAMES)}. "
                f"Received: {self.transfer_dtype!r}"
            )

    def __str__(self):
        return (f"compression {self.compression}, {self.chunk_bytes}-byte chunks, "
                f"transfer dtype {self.transfer_dtype}")

    @property
    def reduced(self):
        """Whether floating tensors travel at reduced precision."""
        return self.transfer_dtype != FULL_PRECISION

    def encode(self, pairs, full_precision=False):
        """`(name, value)` pairs as `tensor_codec.WireTensor`s, floats in the transfer dtype.

        The tensors' bytes are views of the arrays (or of their converted copies): a stream
        copies them chunk by chunk; `tensor_codec.to_message` makes a unary message of one.

        Args:
            pairs: values are arrays, TF tensors, `tf.IndexedSlices` or `tensor_codec.Slices`
                (only their values are converted; ids stay int64).
            full_precision: send floats as they are, whatever the transfer dtype.

        Raises:
            PayloadError: a dtype that cannot travel.
        """
        wanted = None if full_precision or not self.reduced else self.transfer_dtype
        return [tensor_codec.wire_tensor(name, _cast(value, wanted)) for name, value in pairs]


def payload_bytes(tensors):
    """The raw bytes of wire tensors (messages or `WireTensor`s), from their shapes."""
    return sum(sum(tensor_codec.byte_sizes(tensor)) for tensor in tensors)


def _cast(value, wanted):
    if wanted is None:
        return value
    return transfer_dtype.to_transfer_dtype(tensor_codec.as_numpy(value), wanted)


def decode_tensors(tensors):
    """`(name, value)` pairs of wire tensors (`Tensor` messages or `WireTensor`s);
    float16/bfloat16 values come back as float32.

    Raises:
        PayloadError: see `tensor_codec.decode`.
    """
    pairs = []
    for tensor in tensors:
        value = tensor_codec.decode(tensor)
        values = value.values if isinstance(value, tensor_codec.Slices) else value
        if values.dtype.newbyteorder("=") in _REDUCED:
            value = transfer_dtype.from_transfer_dtype(value)
        pairs.append((tensor.name, value))
    return tuple(pairs)


def push_parts(header, tensors, options):
    """The frames (`TransferFrame` bytes of `PushGradientsPart`s) of a streamed push, made
    lazily as they are sent.

    Args:
        header: the `PushHeader`, carried by the first part.
        tensors: the gradients as `WireTensor`s (see `TransferOptions.encode`).
        options: the `TransferOptions` whose codec and chunk size apply.
    """
    frames = chunking.split_tensors(tensors, options.compression, options.chunk_bytes,
                                    pserver_pb2.PushGradientsPart)
    first = next(frames, None) or chunking.Frame(pserver_pb2.PushGradientsPart(), [])
    first.message.header.CopyFrom(header)
    yield chunking.encode_frame(first)
    for frame in frames:
        yield chunking.encode_frame(frame)


def read_push(frames, max_bytes=None):
    """`(PushHeader, [WireTensor])` of a streamed push from its frames (bytes): every part
    read, every chunk checked.

    Args:
        frames: the parts as they arrive (e.g. a streaming servicer's request iterator).
        max_bytes: the most bytes of frames to read, and of tensors to rebuild (None: no
            limit); checked as each frame arrives and each header is read, so a larger push
            is refused before the rest of it is received or allocated.

    Raises:
        PayloadError: no parts, a header missing from the first part or repeated in another,
            a malformed frame, a corrupt, missing, duplicated or reordered chunk (see
            `chunking`), or more than `max_bytes`.
    """
    joiner = joining.TensorJoiner(max_bytes)
    header = None
    received = 0
    for index, raw in enumerate(frames):
        received += len(raw)
        if max_bytes is not None and received > max_bytes:
            raise PayloadError(f"A streamed push may hold at most {max_bytes} bytes. "
                               f"Received: {received} bytes by part {index}")
        frame = chunking.decode_frame(raw, pserver_pb2.PushGradientsPart)
        if frame.message.HasField("header") != (index == 0):
            where = "is missing from the first part" if index == 0 else f"repeats in part {index}"
            raise PayloadError(
                f"A streamed push carries its header in its first part only. Received: the "
                f"header {where}"
            )
        if index == 0:
            header = frame.message.header
        joiner.add(frame)
    if header is None:
        raise PayloadError("A streamed push needs at least one part. Received: an empty stream")
    return header, joiner.finish()


def pull_parts(initialized, model_version, tensors, options, incarnation=0, pushed=None):
    """The frames (`TransferFrame` bytes of `PullDensePart`s) of a streamed dense pull, made
    lazily as they are sent; `pushed`, a `PushGradientsResponse`, goes in the first (the
    answer of a `PushPullStream`)."""
    frames = chunking.split_tensors(tensors, options.compression, options.chunk_bytes,
                                    pserver_pb2.PullDensePart)
    first = next(frames, None) or chunking.Frame(pserver_pb2.PullDensePart(), [])
    first.message.initialized = initialized
    first.message.model_version = model_version
    first.message.incarnation = incarnation
    if pushed is not None:
        first.message.pushed.CopyFrom(pushed)
    yield chunking.encode_frame(first)
    for frame in frames:
        yield chunking.encode_frame(frame)


def read_pull(frames):
    """`(first PullDensePart, [WireTensor])` of a streamed dense pull from its frames (bytes);
    the first part carries `initialized`, `model_version` and `incarnation`.

    Raises:
        PayloadError: an empty stream, a malformed frame, or a corrupt, missing or reordered
            chunk.
    """
    joiner = joining.TensorJoiner()
    first = None
    for raw in frames:
        frame = chunking.decode_frame(raw, pserver_pb2.PullDensePart)
        if first is None:
            first = frame.message
        joiner.add(frame)
    if first is None:
        raise PayloadError("A streamed pull answers with at least one part. "
                           "Received: an empty stream")
    return first, joiner.finish()


def embedding_frame(model_version, tensors, options):
    """The frame (`TransferFrame` bytes of one `PullEmbeddingResponse`) answering an
    embedding pull with `tensors`, the rows of each table."""
    frame = chunking.one_frame(tensors, options.compression, options.chunk_bytes,
                               pserver_pb2.PullEmbeddingResponse)
    frame.message.model_version = model_version
    return chunking.encode_frame(frame)


def read_embedding_frame(raw):
    """`(model_version, [WireTensor])` of an embedding pull's answer (frame bytes).

    Raises:
        PayloadError: a malformed frame, or a corrupt, missing or reordered chunk.
    """
    frame = chunking.decode_frame(raw, pserver_pb2.PullEmbeddingResponse)
    joiner = joining.TensorJoiner()
    joiner.add(frame)
    return frame.message.model_version, joiner.finish()
