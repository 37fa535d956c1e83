"""Codecs that compress one chunk of a transfer: none, snappy, lz4, and auto.

Every codec is chosen by name in one registry (`get_codec`). The names a chunk may carry on
the wire are `WIRE_CODECS`: "none", "snappy" (snappy's raw format) and "lz4" (lz4's block
format, without a size prefix: the chunk carries its raw size). "auto" is a policy, not a
format: it sends each chunk either with snappy or raw (see `AutoCodec`).

A codec never makes a chunk bigger: `pack` sends a chunk raw, labelled "none", when the
codec's output is not smaller than its input. Decompression checks that the output has
exactly the size the chunk announced and raises `PayloadError` otherwise. Before any output
buffer is allocated, `check_raw_size` refuses an announced size that the data cannot hold
(more than the format's `EXPANSION` times its bytes: snappy stands for at most about 21.3
bytes per byte, lz4 for about 255) or that is above the caller's limit, so a small corrupt
or hostile chunk cannot make a receiver allocate much.

Example:

    >>> codec = get_codec("snappy")
    >>> name, data = codec.pack(bytes(1000))
    >>> name, len(data) < 1000
    ('snappy', True)
    >>> get_codec(name).decompress(data, 1000) == bytes(1000)
    True
"""

import abc

import cramjam

from elastic_keras.common.errors import ConfigError, PayloadError

WIRE_CODECS = ("none", "snappy", "lz4")


class Codec(abc.ABC):
    """Compresses and decompresses one chunk of bytes; stateless and thread-safe."""

    name = ""
    # The most raw bytes one byte of the format can stand for, and a constant beside.
    EXPANSION, SLACK = 1, 0

    def check_raw_size(self, size, raw_size, limit=None):
        """Raises `PayloadError` unless `size` bytes of this format can decompress to
        `raw_size` bytes and `raw_size` is at most `limit` (None: no limit). Allocates nothing.
        """
        most = size * self.EXPANSION + self.SLACK
        if raw_size > most:
            raise PayloadError(
                f"{self.name} data must decompress to {raw_size} bytes, as announced, and "
                f"{size} bytes of it decompress to at most {most}. Received: {size} bytes")
        if limit is not None and raw_size > limit:
            raise PayloadError(f"{self.name} data may decompress to at most {limit} bytes "
                               f"here. Received: data announcing {raw_size} bytes")

    @abc.abstractmethod
    def compress(self, data):
        """Returns the compressed form of `data` (any bytes-like object) as `bytes`."""

    @abc.abstractmethod
    def decompress_into(self, data, out):
        """Decompresses `data` into the writable buffer `out`, which it must fill exactly.

        Raises:
            PayloadError: `data` is corrupt or does not decompress to `len(out)` bytes.
        """

    def decompress(self, data, expected_size, limit=None):
        """Returns `data` decompressed, as `bytes` of length `expected_size`.

        Raises:
            PayloadError: `data` is corrupt, does not decompress to `expected_size` bytes, or
                `expected_size` is above `limit` or more than `data` can hold (checked before
                allocating, see `check_raw_size`).
        """
        self.check_raw_size(len(data), expected_size, limit)
        out = bytearray(expected_size)
        self.decompress_into(data, memoryview(out))
        return bytes(out)

    def pack(self, raw):
        """Prepares one chunk for the wire: returns `(wire codec name, bytes to send)`.

        The data is `raw` itself (not copied, whatever bytes-like object it is), labelled
        "none", when compressing does not shrink it.
        """
        data = self.compress(raw)
        if len(data) < len(raw):
            return self.name, data
        return "none", raw

    def _size_error(self, expected, received):
        return PayloadError(
            f"{self.name} data must decompress to {expected} bytes. Received: {received}"
        )


class NoneCodec(Codec):
    """Sends bytes as they are. `pack` copies nothing, nor does `decompress` of `bytes`."""

    name = "none"

    def compress(self, data):
        return bytes(data)

    def decompress_into(self, data, out):
        if len(data) != len(out):
            raise self._size_error(len(out), f"{len(data)} bytes")
        out[:] = data

    def decompress(self, data, expected_size, limit=None):
        self.check_raw_size(len(data), expected_size, limit)
        if len(data) != expected_size:
            raise self._size_error(expected_size, f"{len(data)} bytes")
        return bytes(data)

    def pack(self, raw):
        return self.name, raw


class SnappyCodec(Codec):
    """Snappy's raw format (no framing), through cramjam."""

    name = "snappy"
    EXPANSION, SLACK = 22, 64  # a 3-byte copy stands for up to 64 bytes

    def compress(self, data):
        return bytes(cramjam.snappy.compress_raw(data))

    def decompress_into(self, data, out):
        try:
            # The format starts with its decompressed length: check it before any work.
            announced = cramjam.snappy.decompress_raw_len(data)
            if announced != len(out):
                raise self._size_error(len(out), f"data announcing {announced} bytes")
            written = cramjam.snappy.decompress_raw_into(data, out)
        except cramjam.DecompressionError as exc:
            raise PayloadError(f"snappy data is corrupt. Received: {exc}") from exc
        if written != len(out):
            raise self._size_error(len(out), f"{written} bytes")


class Lz4Codec(Codec):
    """LZ4's block format without a size prefix, through cramjam."""

    name = "lz4"
    EXPANSION, SLACK = 255, 64  # each 0xFF length byte stands for 255 more bytes

    def compress(self, data):
        return bytes(cramjam.lz4.compress_block(data, store_size=False))

    def decompress_into(self, data, out):
        # Output longer than `out` fails inside lz4; shorter output shows in `written`.
        try:
            written = cramjam.lz4.decompress_block_into(data, out)
        except cramjam.DecompressionError as exc:
            raise PayloadError(
                f"lz4 data must decompress to {len(out)} bytes. Received: corrupt or longer "
                f"data ({exc})"
            ) from exc
        if written != len(out):
            raise self._size_error(len(out), f"{written} bytes")


class AutoCodec(SnappyCodec):
    """Snappy where it pays: each chunk goes with snappy only if that at least halves it.

    The rule, per chunk of `n` bytes:

    - `n <= 4 * SAMPLE_BYTES` (256 KiB): compress the whole chunk with snappy.
    - larger: compress 4 samples of `SAMPLE_BYTES` (64 KiB) taken at 0, n/4, n/2 and 3n/4.
      If they do not shrink by `MIN_SAVING` together, send the chunk raw without compressing
      it; else compress the whole chunk.
    - keep the snappy bytes only if they are at most `(1 - MIN_SAVING) * n`; else send raw.

    Why half: compressing and decompressing cost both sides CPU time (snappy runs at about
    1 GB/s on float data), which on a 10 Gb/s network or loopback buys back less time than
    it costs unless most bytes go. Mostly-zero gradients (after a ReLU, from a sparse
    feature) shrink 5x and go compressed; dense ones, and a kernel whose rows are zero for
    half its inputs, go raw at no cost beyond the samples. The receiver sees "snappy" or
    "none" on each chunk, never "auto".
    """

    name = "auto"
    SAMPLE_BYTES = 64 << 10
    SAMPLES = 4
    MIN_SAVING = 0.5

    def pack(self, raw):
        size = len(raw)
        if size == 0:
            return "none", raw
        if size > self.SAMPLES * self.SAMPLE_BYTES and not self._sample_pays(raw):
            return "none", raw
        data = self.compress(raw)
        if len(data) <= (1 - self.MIN_SAVING) * size:
            return SnappyCodec.name, data
        return "none", raw

    def _sample_pays(self, raw):
        view = memoryview(raw)
        size = len(view)
        compressed = 0
        for i in range(self.SAMPLES):
            start = size * i // self.SAMPLES
            compressed += len(cramjam.snappy.compress_raw(view[start:start + self.SAMPLE_BYTES]))
        return compressed <= (1 - self.MIN_SAVING) * self.SAMPLES * self.SAMPLE_BYTES


_CODECS = {codec.name: codec for codec in (NoneCodec(), SnappyCodec(), Lz4Codec(), AutoCodec())}
CODEC_NAMES = tuple(_CODECS)  # what a user may choose, e.g. for `--compression`


def get_codec(name):
    """The codec called `name`: one of `CODEC_NAMES` ("none", "snappy", "lz4", "auto").

    Raises:
        ConfigError: no codec has that name.
    """
    if isinstance(name, Codec):
        return name
    try:
        return _CODECS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"compression must be one of {', '.join(CODEC_NAMES)}. Received: {name!r}"
        ) from None


def wire_codec(name):
    """The codec that reads a chunk labelled `name` on the wire: one of `WIRE_CODECS`.

    Raises:
        PayloadError: a peer labelled a chunk with a name that is not a wire codec.
    """
    if name not in WIRE_CODECS:
        raise PayloadError(f"codec must be one of {', '.join(WIRE_CODECS)}. Received: {name!r}")
    return _CODECS[name]
