"""Transfers over real loopback gRPC: a PServer shard and a PSClient with every codec and
transfer dtype; chunked streams; corrupt, missing and repeated pushes."""

import json

import grpc
import keras
import numpy as np
import pytest

from elastic_keras.common import rpc
from elastic_keras.common.transfer import chunking, tensor_codec, tensor_stream, transfer_dtype
from elastic_keras.common.transfer.compression import CODEC_NAMES
from elastic_keras.common.ps_client import UNARY_MAX_BYTES, PSClient
from elastic_keras.common.transfer.tensor_stream import TransferOptions, push_parts
from elastic_keras.proto import pserver_pb2
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.ps.shard_types import TableConfig

CHUNK = 64 << 10
DTYPES = ("float32", "float16", "bfloat16")
# Relative precision of each transfer dtype, and the float16 subnormal step for values near 0.
PRECISION = {"float32": 0.0, "float16": 2.0**-11, "bfloat16": 2.0**-8}
ABSOLUTE = 2.0**-24

RNG = np.random.default_rng(3)
INITIAL = {
    "big/kernel": RNG.standard_normal((200, 500)).astype(np.float32),   # 400 KB: 7 chunks
    "small/bias": RNG.standard_normal(16).astype(np.float32),
    "steps": np.array(0, np.int64),
}
GRADS = {
    "big/kernel": RNG.standard_normal((200, 500)).astype(np.float32),
    "small/bias": RNG.standard_normal(16).astype(np.float32),
}
TABLE = TableConfig("emb", dim=8, initializer=json.dumps(
    keras.initializers.serialize(keras.initializers.RandomNormal(seed=1))))
ROW_IDS = np.array([3, 17, 900_001], np.int64)
ROW_GRADS = RNG.standard_normal((3, 8)).astype(np.float32)
SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(1.0)))  # new = old - grad


class RecordingServicer(PServerServicer):
    """A PServer servicer that records which RPC served each call and how many parts."""

    def __init__(self, parameters, transfer):
        super().__init__(parameters, transfer)
        self.calls = []

    def PushGradients(self, request, context):
        self.calls.append(("PushGradients", 1))
        return super().PushGradients(request, context)

    def PushGradientsStream(self, request_iterator, context):
        parts = []

        def counted():
            for part in request_iterator:
                parts.append(part)
                yield part

        try:
            return super().PushGradientsStream(counted(), context)
        finally:
            self.calls.append(("PushGradientsStream", len(parts)))

    def PullDense(self, request, context):
        self.calls.append(("PullDense", 1))
        return super().PullDense(request, context)

    def PullDenseStream(self, request, context):
        count = 0
        for part in super().PullDenseStream(request, context):
            count += 1
            yield part
        self.calls.append(("PullDenseStream", count))


@pytest.fixture
def shard():
    """`make(compression, transfer_dtype)`: a served shard holding INITIAL and table "emb"
    (SGD, learning rate 1), and a PSClient; both with those options and 64 KiB chunks.
    Returns (parameters, servicer, client, stub)."""
    made = []

    def make(compression="auto", dtype="float32", initial=INITIAL, chunk_bytes=CHUNK):
        options = TransferOptions(compression, chunk_bytes, dtype)
        parameters = Parameters()
        parameters.init_model(list(initial.items()), SGD, [TABLE])
        servicer = RecordingServicer(parameters, options)
        server, port = rpc.create_server(
            [lambda s: add_to_server(servicer, s)])
        address = f"127.0.0.1:{port}"
        client = PSClient([address], deadline_s=30, transfer=options)
        channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30)
        made.append((server, client, channel))
        return parameters, servicer, client, rpc.Stub(channel, tensor_stream.PSERVER)

    yield make
    for server, client, channel in made:
        client.close()
        channel.close()
        server.stop(0)


def rounded(value, dtype):
    """`value` as the shard gets it: through `dtype` and back to float32."""
    if dtype == "float32":
        return value
    return transfer_dtype.from_transfer_dtype(transfer_dtype.to_transfer_dtype(value, dtype))


def assert_within(actual, expected, dtype):
    assert actual.dtype == np.float32
    np.testing.assert_allclose(actual, expected, rtol=PRECISION[dtype], atol=ABSOLUTE)


def shard_state(parameters):
    """(version, {name: value}) the shard holds, read directly."""
    result = parameters.pull()
    return result.model_version, result.dense


# --- round trips --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("compression", CODEC_NAMES)
def test_push_and_pull_round_trip(shard, compression, dtype):
    parameters, servicer, client, _ = shard(compression, dtype)
    rows_before = client.pull_embeddings({"emb": ROW_IDS})["emb"]
    table_before = parameters.pull_embeddings([("emb", ROW_IDS)])[0]["emb"]
    assert_within(rows_before, table_before, dtype)

    (response,) = client.push_gradients(0, 1, [0], GRADS, {"steps": np.array(5, np.int64)},
                                        {"emb": (ROW_IDS, ROW_GRADS)})
    assert response.accepted and response.model_version == 1

    # The shard converted the gradients back before applying them, and keeps float32.
    version, state = shard_state(parameters)
    assert version == 1 and state["steps"] == 5
    for name, grad in GRADS.items():
        assert state[name].dtype == np.float32
        np.testing.assert_array_equal(state[name], INITIAL[name] - rounded(grad, dtype))
    table_after = parameters.pull_embeddings([("emb", ROW_IDS)])[0]["emb"]
    assert table_after.dtype == np.float32
    np.testing.assert_allclose(table_after, table_before - rounded(ROW_GRADS, dtype),
                               rtol=1e-6)

    # Pulled values come in the transfer dtype, back as float32 within its precision.
    initialized, versions, pulled = client.pull_dense()
    assert initialized and versions == [1]
    assert pulled["steps"] == 5 and pulled["steps"].dtype == np.int64
    for name in GRADS:
        assert_within(pulled[name], state[name], dtype)
        np.testing.assert_array_equal(pulled[name], rounded(state[name], dtype))
    assert_within(client.pull_embeddings({"emb": ROW_IDS})["emb"], table_after, dtype)

    # 400 KB of gradients exceed a 64 KiB chunk: streamed in several parts, either way.
    push_calls = [c for c in servicer.calls if c[0].startswith("Push")]
    assert push_calls[0][0] == "PushGradientsStream" and push_calls[0][1] > 2


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_full_precision_pull_is_exact(shard, dtype):
    parameters, _, client, _ = shard("lz4", dtype)
    client.push_gradients(0, 1, [0], GRADS)
    _, _, pulled = client.pull_dense(full_precision=True)
    _, state = shard_state(parameters)
    for name, value in state.items():
        np.testing.assert_array_equal(pulled[name], value)


@pytest.mark.parametrize("compression", CODEC_NAMES)
def test_small_payloads_go_unary_unless_snappy_or_lz4_is_asked_for(shard, compression):
    small = {"small/bias": INITIAL["small/bias"]}
    parameters, servicer, client, _ = shard(compression, "bfloat16", initial=small)
    client.push_gradients(0, 1, [0], {"small/bias": GRADS["small/bias"]})
    client.pull_dense()
    client.pull_dense()
    streamed = compression not in ("none", "auto")
    assert [name for name, _ in servicer.calls] == [
        "PushGradientsStream" if streamed else "PushGradients",
        "PullDenseStream",                                  # size not known yet
        "PullDenseStream" if streamed else "PullDense",     # known to be small
    ]
    _, state = shard_state(parameters)
    np.testing.assert_array_equal(
        state["small/bias"], small["small/bias"] - rounded(GRADS["small/bias"], "bfloat16"))


def test_a_payload_over_the_unary_bound_streams_even_within_one_chunk(shard):
    big = {"big/kernel": INITIAL["big/kernel"]}  # 400 KB: over UNARY_MAX_BYTES, in 1 chunk
    assert UNARY_MAX_BYTES < big["big/kernel"].nbytes < 1 << 20
    parameters, servicer, client, _ = shard("none", initial=big, chunk_bytes=1 << 20)
    client.push_gradients(0, 1, [0], {"big/kernel": GRADS["big/kernel"]})
    client.pull_dense()
    client.pull_dense()
    assert [name for name, _ in servicer.calls] == ["PushGradientsStream"] + [
        "PullDenseStream"] * 2
    np.testing.assert_array_equal(shard_state(parameters)[1]["big/kernel"],
                                  big["big/kernel"] - GRADS["big/kernel"])


def test_a_tensor_many_times_the_chunk_size_streams_in_chunks(shard):
    huge = {"huge": np.zeros((1 << 20,), np.float32)}   # 4 MiB: 64 chunks
    parameters, servicer, client, _ = shard("none", "float32", initial=huge)
    grad = {"huge": RNG.standard_normal(1 << 20).astype(np.float32)}
    client.push_gradients(0, 1, [0], grad)
    assert servicer.calls == [("PushGradientsStream", 64)]
    np.testing.assert_array_equal(shard_state(parameters)[1]["huge"], -grad["huge"])
    np.testing.assert_array_equal(client.pull_dense()[2]["huge"], -grad["huge"])
    assert servicer.calls[-1] == ("PullDenseStream", 64)


# --- faults -------------------------------------------------------------------------------


def _parts(compression="lz4", sequence=1, dtype="float32"):
    """The frames of a streamed push of GRADS (and an assignment) by worker 2, decoded (their
    chunks' bytes copied, so that a test may change them)."""
    options = TransferOptions(compression, CHUNK, dtype)
    header = pserver_pb2.PushHeader(
        worker_id=2, sequence=sequence,
        deltas=[tensor_codec.encode("steps", np.array(9, np.int64))])
    frames = [chunking.decode_frame(raw, pserver_pb2.PushGradientsPart)
              for raw in push_parts(header, options.encode(GRADS.items()), options)]
    assert len(frames) > 3
    return [chunking.Frame(f.message, [bytes(d) for d in f.data]) for f in frames]


def _push_raw(stub, parts):
    """Sends `parts` (frames, or bytes as they are) as a streamed push, which must fail with
    INVALID_ARGUMENT; returns the error's details."""
    sent = [p if isinstance(p, bytes) else chunking.encode_frame(p) for p in parts]
    with pytest.raises(grpc.RpcError) as info:
        stub.PushGradientsStream(iter(sent))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    return info.value.details()


def _assert_unchanged_then_sequence_still_free(parameters, client, before):
    version, state = shard_state(parameters)
    assert version == before[0]
    for name, value in before[1].items():
        np.testing.assert_array_equal(state[name], value)
    assert parameters.staleness.counts[0] == 0
    # (worker 2, sequence 1) was not recorded: the same push now applies.
    (response,) = client.push_gradients(2, 1, [0], GRADS, {"steps": np.array(9, np.int64)})
    assert response.accepted and response.reason == "" and response.model_version == 1
    assert shard_state(parameters)[1]["steps"] == 9


@pytest.mark.parametrize("compression", ["none", "lz4", "snappy"])
def test_a_corrupt_chunk_rejects_the_whole_push(shard, compression):
    parameters, _, client, stub = shard(compression)
    before = shard_state(parameters)
    parts = _parts(compression)
    data = bytearray(parts[2].data[-1])
    data[len(data) // 2] ^= 0x40
    parts[2].data[-1] = bytes(data)
    assert "fails its checksum" in _push_raw(stub, parts)
    _assert_unchanged_then_sequence_still_free(parameters, client, before)


@pytest.mark.parametrize("fault, message", [
    ("not a frame", "holds its message (field 1) and its payload (field 2)"),
    ("payload too short", "is cut short"),
    ("payload too long", "chunks announce"),
])
def test_a_malformed_frame_rejects_the_whole_push(shard, fault, message):
    parameters, _, client, stub = shard("none")
    before = shard_state(parameters)
    parts = _parts("none")
    raw = chunking.encode_frame(parts[1])
    parts[1] = {
        "not a frame": lambda: b"\x18\x01" + raw,  # a field 3 before the frame's own
        "payload too short": lambda: raw[:-1],
        "payload too long": lambda: _with_longer_payload(raw),
    }[fault]()
    assert message in _push_raw(stub, parts)
    _assert_unchanged_then_sequence_still_free(parameters, client, before)


def _with_longer_payload(raw):
    """`raw` (a frame) re-encoded with one more byte of payload than its chunks announce."""
    frame = chunking.decode_frame(raw, pserver_pb2.PushGradientsPart)
    return chunking.encode_frame(chunking.Frame(frame.message, [*frame.data, b"\x00"]))


@pytest.mark.parametrize("dropped", ["middle", "last"])
def test_a_missing_chunk_rejects_the_whole_push(shard, dropped):
    parameters, _, client, stub = shard("lz4")
    before = shard_state(parameters)
    parts = _parts()
    del parts[2 if dropped == "middle" else -1]
    expected = ("expected chunk content[2] of 7: missing or out of order" if dropped == "middle"
                else "chunk content[6] of 7 is missing")
    assert expected in _push_raw(stub, parts)
    _assert_unchanged_then_sequence_still_free(parameters, client, before)


@pytest.mark.parametrize("fault, message", [
    ("no header", "header is missing from the first part"),
    ("two headers", "header repeats in part 1"),
    ("header lies about sizes", "must announce"),
])
def test_a_malformed_stream_rejects_the_whole_push(shard, fault, message):
    parameters, _, client, stub = shard("snappy")
    before = shard_state(parameters)
    parts = _parts("snappy")
    if fault == "no header":
        parts[0].message.ClearField("header")
    elif fault == "two headers":
        parts[1].message.header.CopyFrom(parts[0].message.header)
    else:
        header = next(p.header for p in parts[0].message.pieces if p.HasField("header"))
        header.content_size += 4
    assert message in _push_raw(stub, parts)
    _assert_unchanged_then_sequence_still_free(parameters, client, before)


def test_a_duplicate_streamed_push_is_applied_once(shard):
    parameters, servicer, client, stub = shard("lz4", "bfloat16")
    first = client.push_gradients(2, 7, [0], GRADS)[0]
    _, once = shard_state(parameters)
    again = client.push_gradients(2, 7, [0], GRADS)[0]
    replayed = stub.PushGradientsStream(
        chunking.encode_frame(f) for f in _parts("lz4", sequence=7, dtype="bfloat16"))
    assert first.reason == "" and first.model_version == 1
    for response in (again, replayed):
        assert response.accepted and response.reason == "duplicate"
        assert response.model_version == 1
    version, state = shard_state(parameters)
    assert version == 1 and state["steps"] == 0
    for name in GRADS:
        np.testing.assert_array_equal(state[name], once[name])
    assert [name for name, _ in servicer.calls] == ["PushGradientsStream"] * 3
