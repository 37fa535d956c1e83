"""Transfers of a 50 MB dense model: bytes on the wire and push/pull times for every codec
and transfer dtype, beside raw gRPC loopback moving the same bytes in the same run.

`python -m bench.transfer [--quick]` (or `python -m bench transfer`).

The model is 5 float32 variables of 10 MB each (10 MB in all with --quick), so every push
and pull, even at half precision, exceeds one 4 MiB chunk and is streamed. Two payloads:
`random` (normal values: incompressible, as real gradients mostly are) and `zero90` (90% of
the values 0, as after a ReLU or a sparse feature); a payload's gradients are pushed and a
model of the same kind is pulled (the PS applies SGD with learning rate 0, so the values it
sends stay of that kind). For each payload, codec (none, snappy, lz4, auto) and transfer
dtype (float32, float16, bfloat16), a PS process on 127.0.0.1 serves a fresh shard with those
options, and a `PSClient` in this process with the same options pushes and pulls:

- `transfer/push`, `transfer/pull`: ms per call, median of N (7; 3 with --quick), from the
  call to the answer: conversion, compression, chunking, gRPC, checks, the PS's optimizer
  step (push) or snapshot (pull), decoding. The peer, `raw_grpc_bytes`, is `bench.raw_grpc`,
  a generic bytes service in another process on 127.0.0.1, moving messages of exactly the
  sizes of the transfer's messages (a client stream into a sink; a server stream out of a
  source), with no protobuf, codec or tensor work. `config.mb_per_s` is model MB / our time;
  `config.raw_mb_per_s` is wire MB / the peer's time.
- `transfer/push_bytes`, `transfer/pull_bytes`: bytes on the wire, the sum of the serialized
  sizes of the call's messages; the peer, `float32_payload`, is the raw bytes of the model.
- `transfer/streamed_push`, `transfer/streamed_pull`: what `PSClient`'s choice between the
  unary and the streamed calls rests on: ms per streamed call (codec none, float32) beside
  the unary call (peer `unary`) for random models of 0.1, 1, 4.7 and 50 MB (50 MB left out
  with --quick), median of 30 calls (7 at 50 MB; 10 and 3 with --quick).

`throughput(quick)` (run by `python -m bench micro`) gives the same measurement as MB/s, for
a 50 MB model with codecs none and auto, float32: `transfer/push_mb_per_s`,
`transfer/pull_mb_per_s`.

`peak_rss_mb` is this (client) process's own peak resident memory; `config.ps_peak_rss_mb`
the PS process's so far. The PS process serves real shards (`PServerServicer(Parameters(),
options)`) without a master, one at a time, so that it starts once:
`python -m bench.transfer serve ps CHUNK_BYTES CODEC DTYPE` prints the port of the first
shard; each line "CODEC DTYPE" on its stdin replaces the shard and prints the new port.
"""

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np

from bench.common import ChildServer, emit
from bench.raw_grpc import RawPeer
from elastic_keras.common import rpc
from elastic_keras.common.transfer import chunking, compression, tensor_stream

VARIABLES = 5
PAYLOADS = ("random", "zero90")
CONFIGS = [(codec, dtype) for codec in compression.CODEC_NAMES
           for dtype in tensor_stream.TRANSFER_DTYPE_NAMES]
MB = 1e6


def model(kind, total_bytes):
    """`{name: float32 array}` of `total_bytes` in all: random normal, or 90% zeros."""
    rng = np.random.default_rng(0 if kind == "random" else 1)
    values = {}
    rows = total_bytes // 4 // VARIABLES // 100
    for i in range(VARIABLES):
        array = (rng.standard_normal((rows, 100)) * 1e-2).astype(np.float32)
        if kind == "zero90":
            array[rng.random(array.shape) < 0.9] = 0
        values[f"dense_{i}/kernel"] = array
    return values


# --- the PS server, in its own process (the raw one is `bench.raw_grpc`) ----------------------


def serve_ps(chunk_bytes, codec, dtype):
    """One fresh shard at a time, serving with `codec` and `dtype`; each line "CODEC DTYPE"
    read from stdin replaces it (the old one stopped and dropped) and prints the new port."""
    import gc

    from elastic_keras.ps.parameters import Parameters
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    server = None
    while True:
        if server is not None:
            server.stop(None)
            server = None
            gc.collect()
        options = tensor_stream.TransferOptions(codec, int(chunk_bytes), dtype)
        servicer = PServerServicer(Parameters(), options)
        server, port = rpc.create_server(
            [lambda s: add_to_server(servicer, s)])
        del servicer
        print(port, flush=True)
        line = sys.stdin.readline()
        if not line:
            server.stop(None)
            return
        codec, dtype = line.split()


# --- measuring -------------------------------------------------------------------------------


def own_peak_rss_mb():
    """This process's largest resident set so far, in MB (its children left out)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median_ms(call, repeats):
    """The median wall time of `repeats` calls of `call` after one warm-up call, in ms."""
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


def push_sizes(values, options):
    """The serialized sizes of the messages of a push of `values` (the same as the client's)."""
    from elastic_keras.proto import pserver_pb2

    header = pserver_pb2.PushHeader(worker_id=0, sequence=1)
    parts = tensor_stream.push_parts(header, options.encode(values.items()), options)
    return [len(part) for part in parts]


def pull_sizes(address):
    """The serialized sizes of the messages of a full dense pull from the shard at `address`."""
    from elastic_keras.proto import pserver_pb2

    channel = rpc.create_channel(address, "elastic_keras.PServer")
    try:
        stub = rpc.Stub(channel, tensor_stream.PSERVER)
        return [len(part) for part in stub.PullDenseStream(pserver_pb2.PullDenseRequest(
            known_version=-1))]
    finally:
        channel.close()


def time_transfer(values, codec, dtype, ps, raw, repeats):
    """Times pushes and pulls of `values` against a fresh shard of the `ps` process (serving
    with `codec` and `dtype`), and the raw peer moving the same messages.

    Returns:
        `{way: (our ms, raw ms, message sizes)}` for "push" and "pull": medians of `repeats`.
    """
    from elastic_keras.common.ps_client import PSClient

    options = tensor_stream.TransferOptions(codec, chunking.DEFAULT_CHUNK_BYTES, dtype)
    sgd = json.dumps({"class_name": "SGD", "config": {"learning_rate": 0.0}})
    address = ps.ask(f"{codec} {dtype}")[0]
    client = PSClient([address], deadline_s=600, transfer=options)
    try:
        client.init_model(values, sgd)
        sequence = iter(range(1, 1 << 30))
        push_ms = median_ms(
            lambda: client.push_gradients(0, next(sequence), [0], values), repeats)
        pull_ms = median_ms(client.pull_dense, repeats)
        sizes = {"push": push_sizes(values, options), "pull": pull_sizes(address)}
    finally:
        client.close()
    messages = [bytes(n) for n in sizes["push"]]
    return {
        "push": (push_ms, median_ms(lambda: raw.send(messages), repeats), sizes["push"]),
        "pull": (pull_ms, median_ms(lambda: raw.receive(sizes["pull"]), repeats),
                 sizes["pull"]),
    }


def _config(kind, values, codec, dtype, sizes, ms, raw_ms, repeats, ps):
    model_bytes = sum(v.nbytes for v in values.values())
    wire = sum(sizes)
    return {"payload": kind, "codec": codec, "transfer_dtype": dtype,
            "model_mb": round(model_bytes / MB, 1), "chunk_bytes": chunking.DEFAULT_CHUNK_BYTES,
            "messages": len(sizes), "wire_mb": round(wire / MB, 2),
            "mb_per_s": round(model_bytes / MB / (ms / 1e3), 1),
            "raw_mb_per_s": round(wire / MB / (raw_ms / 1e3), 1),
            "repeats": repeats, "ps_peak_rss_mb": round(ps.peak_rss_mb(), 1)}


def measure(kind, values, codec, dtype, ps, raw, repeats):
    """Emits the four results of one payload, codec and transfer dtype (ms and bytes)."""
    model_bytes = sum(v.nbytes for v in values.values())
    for way, (ms, raw_ms, sizes) in time_transfer(values, codec, dtype, ps, raw,
                                                  repeats).items():
        config = _config(kind, values, codec, dtype, sizes, ms, raw_ms, repeats, ps)
        emit(f"transfer/{way}", config, ms, "ms", own_peak_rss_mb(), peer="raw_grpc_bytes",
             peer_value=raw_ms)
        emit(f"transfer/{way}_bytes", config, sum(sizes), "bytes", own_peak_rss_mb(),
             peer="float32_payload", peer_value=model_bytes)


def throughput(quick):
    """`transfer/push_mb_per_s` and `transfer/pull_mb_per_s`: MB/s of a 50 MB model (random float32
    values, 5 variables) pushed to and pulled from one PS process, against raw gRPC moving
    messages of the same sizes (the same chunking) in the same run, for codec none and (not
    with `quick`) for the default, auto. `value` is model MB / our median time; `peer_value` wire MB / the raw
    peer's (the same bytes: random values do not compress)."""
    repeats = 3 if quick else 7
    values = model("random", 50 * 1_000_000)
    model_mb = sum(v.nbytes for v in values.values()) / MB
    with ChildServer("bench.raw_grpc") as raw_server, \
            ChildServer("bench.transfer", "ps", chunking.DEFAULT_CHUNK_BYTES, "none",
                        "float32") as ps:
        raw = RawPeer(raw_server.address)
        try:
            for codec in ("none",) if quick else ("none", "auto"):
                timed = time_transfer(values, codec, "float32", ps, raw, repeats)
                for way, (ms, raw_ms, sizes) in timed.items():
                    config = _config("random", values, codec, "float32", sizes, ms, raw_ms,
                                     repeats, ps)
                    emit(f"transfer/{way}_mb_per_s", config, model_mb / (ms / 1e3), "MB/s",
                         own_peak_rss_mb(), peer="raw_grpc_bytes",
                         peer_value=sum(sizes) / MB / (raw_ms / 1e3))
        finally:
            raw.close()


def compare_calls(ps, sizes, quick):
    """Emits streamed against unary push and pull times, codec none and float32."""
    from elastic_keras.common.transfer import tensor_codec
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2

    options = tensor_stream.TransferOptions("none", chunking.DEFAULT_CHUNK_BYTES, "float32")
    sgd = json.dumps({"class_name": "SGD", "config": {"learning_rate": 0.0}})
    sequence = iter(range(1, 1 << 30))
    for size in sizes:
        values = model("random", size)
        address = ps.ask("none float32")[0]
        client = PSClient([address], deadline_s=600, transfer=options)
        channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=600)
        stub = rpc.Stub(channel, tensor_stream.PSERVER)
        pull = pserver_pb2.PullDenseRequest(known_version=-1)
        calls = {
            "push": (
                lambda: stub.PushGradientsStream(tensor_stream.push_parts(
                    pserver_pb2.PushHeader(sequence=next(sequence)),
                    options.encode(values.items()), options)),
                lambda: stub.PushGradients(pserver_pb2.PushGradientsRequest(
                    sequence=next(sequence),
                    gradients=[tensor_codec.to_message(t) for t in options.encode(
                        values.items())])),
            ),
            "pull": (
                lambda: tensor_stream.decode_tensors(
                    tensor_stream.read_pull(stub.PullDenseStream(pull))[1]),
                lambda: tensor_stream.decode_tensors(stub.PullDense(pull).dense),
            ),
        }
        repeats = (3 if quick else 7) if size > 10 * MB else (10 if quick else 30)
        try:
            client.init_model(values, sgd)
            for way, (streamed, unary) in calls.items():
                config = {"model_mb": round(size / MB, 1), "codec": "none",
                          "transfer_dtype": "float32", "repeats": repeats}
                emit(f"transfer/streamed_{way}", config, median_ms(streamed, repeats), "ms",
                     own_peak_rss_mb(), peer="unary", peer_value=median_ms(unary, repeats))
        finally:
            client.close()
            channel.close()


def run(quick, work_dir=None):
    """Prints every result of this suite; `work_dir` is unused."""
    total = (10 if quick else 50) * 1_000_000
    repeats = 3 if quick else 7
    chunk_bytes = chunking.DEFAULT_CHUNK_BYTES
    with ChildServer("bench.raw_grpc") as raw_server, \
            ChildServer("bench.transfer", "ps", chunk_bytes, "none", "float32") as ps:
        raw = RawPeer(raw_server.address)
        try:
            for kind in PAYLOADS:
                values = model(kind, total)
                for codec, dtype in CONFIGS:
                    measure(kind, values, codec, dtype, ps, raw, repeats)
        finally:
            raw.close()
        compare_calls(ps, [100_000, 1_000_000, 4_700_000] + ([] if quick else [total]), quick)


def main():
    if sys.argv[1:3] == ["serve", "ps"]:
        return serve_ps(*sys.argv[3:])
    parser = argparse.ArgumentParser(prog="python -m bench.transfer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="a 10 MB model and 3 calls per figure")
    parser.add_argument("--mb-per-s", action="store_true",
                        help="only the MB/s of a 50 MB model against raw gRPC (`throughput`)")
    args = parser.parse_args()
    if args.mb_per_s:
        throughput(args.quick)
    else:
        run(args.quick)


if __name__ == "__main__":
    main()
