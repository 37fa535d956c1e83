"""Transfer codecs: throughput and compression ratio on gradient-like payloads.

`python -m bench.codec [--quick]` (or `python -m bench codec` once registered there).

Payloads of 50 MB (8 MB with --quick): random float32 gradients, float32 gradients with 90%
zeros (as after a ReLU or a sparse feature), and random float16 gradients (what
`--transfer-dtype float16` sends). For every codec, one JSON line each for:

- `codec/compress` and `codec/decompress`: the codec alone over 4 MiB chunks, in MB/s of raw
  data (1 MB = 10^6 bytes), beside python-snappy's `compress`/`uncompress` on the same chunks.
  Fixed codecs always run their algorithm; "auto" runs its policy (so on random data it
  mostly skips compressing); "none" is a copy. Decompression writes into a preallocated
  buffer, as `Codec.decompress_into` does.
- `codec/ratio`: raw bytes / bytes on the wire (the stream's frames).
- `codec/stream`: the whole wire path, `split_tensors`, encoding and decoding every frame,
  `join_tensors`, beside serializing and parsing the tensor as one unchunked message.

Each time is the best of several runs.
"""

import argparse
import time

import numpy as np
import snappy

from bench.common import emit, peak_rss_mb
from elastic_keras.common.transfer import (
    chunking, compression, joining, tensor_codec, transfer_dtype,
)
from elastic_keras.proto import tensor_pb2

CHUNK = chunking.DEFAULT_CHUNK_BYTES
MB = 1e6


def payloads(size):
    """`{name: array}` of about `size` bytes each."""
    rng = np.random.default_rng(0)
    dense = (rng.standard_normal(size // 4) * 1e-3).astype(np.float32)
    sparse = dense.copy()
    sparse[rng.random(sparse.size) < 0.9] = 0
    half = transfer_dtype.to_transfer_dtype(
        (rng.standard_normal(size // 2) * 1e-3).astype(np.float32), "float16")
    return {"dense_float32": dense, "zero90_float32": sparse, "dense_float16": half}


def best_time(fn, repeats):
    """The shortest wall time of `repeats` calls of `fn`, and its last result."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return best, result


def _chunks(raw):
    view = memoryview(raw)
    return [view[i:i + CHUNK] for i in range(0, len(raw), CHUNK)]


def _codec_rows(config, codec, raw, repeats):
    chunks = _chunks(raw)
    if codec.name == "auto":  # the policy: snappy or raw, chunk by chunk
        compress_s, packed = best_time(lambda: [codec.pack(c) for c in chunks], repeats)
    else:  # the algorithm itself, even where `pack` would send the chunk raw
        compress_s, packed = best_time(
            lambda: [(codec.name, codec.compress(c)) for c in chunks], repeats)
    out = memoryview(bytearray(len(raw)))
    decompress_s, _ = best_time(
        lambda: [compression.wire_codec(name).decompress_into(data, out[i * CHUNK:][:len(c)])
                 for i, ((name, data), c) in enumerate(zip(packed, chunks))], repeats)
    peer_compress_s, peer_packed = best_time(lambda: [snappy.compress(c) for c in chunks],
                                             repeats)
    peer_decompress_s, _ = best_time(lambda: [snappy.uncompress(d) for d in peer_packed],
                                     repeats)
    mb = len(raw) / MB
    emit("codec/compress", config, mb / compress_s, "MB/s", peak_rss_mb(),
         peer="python-snappy", peer_value=mb / peer_compress_s)
    emit("codec/decompress", config, mb / decompress_s, "MB/s", peak_rss_mb(),
         peer="python-snappy", peer_value=mb / peer_decompress_s)


def _stream_rows(config, codec, wire, repeats):
    def round_trip():
        sent = [chunking.encode_frame(f) for f in chunking.split_tensors([wire], codec)]
        joined = joining.join_tensors(chunking.decode_frame(raw) for raw in sent)
        return sent, joined

    stream_s, (sent, (joined,)) = best_time(round_trip, repeats)
    assert bytes(joined.content) == wire.content, "the stream did not give back the tensor"
    peer_s, _ = best_time(lambda: tensor_pb2.Tensor.FromString(wire.SerializeToString()),
                          repeats)
    raw_bytes = len(wire.content)
    wire_bytes = sum(len(m) for m in sent)
    emit("codec/ratio", {**config, "raw_bytes": raw_bytes, "wire_bytes": wire_bytes},
         raw_bytes / wire_bytes, "ratio", peak_rss_mb())
    mb = raw_bytes / MB
    emit("codec/stream", config, mb / stream_s, "MB/s", peak_rss_mb(),
         peer="unchunked_tensor_message", peer_value=mb / peer_s)


def run(quick, work_dir=None):
    """Prints every result of this suite; `work_dir` is unused."""
    size = (8 if quick else 50) * 1_000_000
    repeats = 3 if quick else 5
    for payload, array in payloads(size).items():
        wire = tensor_codec.encode("gradient", array)
        raw = wire.content
        for name in compression.CODEC_NAMES:
            config = {"payload": payload, "codec": name, "mb": round(len(raw) / MB, 1),
                      "chunk_bytes": CHUNK}
            codec = compression.get_codec(name)
            _codec_rows(config, codec, raw, repeats)
            _stream_rows(config, codec, wire, repeats)


def main():
    parser = argparse.ArgumentParser(prog="python -m bench.codec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 MB payloads, fewer repeats")
    run(parser.parse_args().quick)


if __name__ == "__main__":
    main()
