"""Hostile and malformed requests against a live parameter-server shard.

One shard is served over real gRPC on 127.0.0.1 with the job's `ServerAuth`, holding a model
(dense "w" [4, 3] and "b" [3], a non-trainable "steps", a table "emb" of dim 4 and 100 ids)
that a good worker has pushed to. Every request below is one a stranger, a confused or a
compromised role could send. For each: the answer is the named status code listed, never
UNKNOWN or a crash; the shard's version, values, table rows and sequence table are exactly
as before; and the shard answers a good pull right after.

The kinds (`KINDS`, 50 of them, and 3 kinds of stranger), by method:
  no credential, garbage credential, another job's credential (UNAUTHENTICATED);
  InitModel: as another worker, from the master, empty name, repeated name, unknown dtype
    enum, negative dim, overflowing shape, bytes that do not fill the shape, a sparse
    initial value, table dim 2**40, table dim 0, table dtype 'float99', optimizer not JSON,
    optimizer of no Keras class;
  PushGradients: as another worker, from the master, unknown variable, wrong shape,
    a delta of the wrong shape, NaN, +Inf in a table row, sparse id -1, sparse id past the rows,
    float ids, table gradient sent dense, table rows of the wrong width, table id past
    input_dim, delta for a trainable variable, gradient for a non-trainable one, a name
    twice, float64 1e300 for float32 values and rows, a version from the future,
    sequence 2**63-1, a negative sequence, 14 bytes of lz4 announcing 256 MiB;
  PushGradientsStream: a corrupt chunk checksum, no header, garbage frame bytes;
  PushPullStream: no then_pull, a corrupt chunk checksum, no header, NaN, a wrong shape,
    from the master, as another worker;
  PullEmbedding: unknown table, float ids, 2-D ids;
  PullTable: negative rows_per_chunk, unknown table, from a worker;
  PrepareCheckpoint: NaN hold, a week's hold;
  SaveCheckpoint: from a worker, checkpoint id 0, num_ps 2**31-1.
Then hypothesis throws random tensors (any dtype enum, shape, bytes, ids, names) at
PushGradients and InitModel and random bytes at every method, with the same three checks.
"""

import json
import math

import grpc
import keras
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from elastic_keras.common import auth, rpc
from elastic_keras.common.ps_client import PSClient
from elastic_keras.common.transfer import chunking, tensor_codec, tensor_stream
from elastic_keras.proto import pserver_pb2, tensor_pb2
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import AUTHORITY, PServerServicer, add_to_server

JOB = "hostile-ps"
CODES = grpc.StatusCode
ADAM = json.dumps(keras.optimizers.serialize(keras.optimizers.Adam(0.01)))
VALUES = {"w": np.arange(12, dtype=np.float32).reshape(4, 3), "b": np.ones(3, np.float32),
          "steps": np.zeros((), np.float32)}
TABLE = pserver_pb2.EmbeddingTableSpec(name="emb", dim=4, input_dim=100, dtype="float32")
OPTIONS = [pserver_pb2.VariableOptions(name="steps", trainable=False)]
LAST_SEQUENCE = 5  # the good worker's last push; hostile pushes reuse it or go lower


class Shard:
    """The live shard and what its callers hold: credentials and stubs by role."""

    def __init__(self, tmp_path):
        self.secret = auth.new_secret()
        self.parameters = Parameters()
        servicer = PServerServicer(self.parameters, num_ps=1, checkpoint_dir=str(tmp_path))
        self.server, port = rpc.create_server(
            [lambda s: add_to_server(servicer, s)],
            auth=auth.ServerAuth(auth.Verifier(self.secret, JOB), AUTHORITY))
        self.address = f"127.0.0.1:{port}"
        self._channels = []

    def token(self, role="worker", index=0):
        return auth.credential(self.secret, JOB, auth.Identity(auth.Role(role), index))

    def stub(self, token):
        channel = rpc.create_channel(self.address, "elastic_keras.PServer", deadline_s=20,
                                     token=token)
        self._channels.append(channel)
        return rpc.Stub(channel, tensor_stream.PSERVER)

    def raw(self, token, method):
        """`method` taking and returning bytes as they are (unary-unary)."""
        channel = rpc.create_channel(self.address, "elastic_keras.PServer", deadline_s=20,
                                     token=token)
        self._channels.append(channel)
        return channel.unary_unary(f"/elastic_keras.PServer/{method}")

    def state(self):
        """Everything a bad request must leave as it was: version, dense values, table rows
        and slots, optimizer state, sequence table, push counts."""
        snapshot = self.parameters.snapshot()
        return (snapshot.version, dict(snapshot.applied_sequences),
                dict(snapshot.applied_pushes), _plain(snapshot.dense),
                _plain(snapshot.table_states), _plain(snapshot.optimizer_slots),
                snapshot.optimizer_iterations, snapshot.optimizer_config)

    def close(self):
        for channel in self._channels:
            channel.close()
        self.server.stop(grace=None)


def _plain(value):
    """`value` with arrays as (dtype, shape, bytes) and dataclasses as dicts: comparable."""
    if isinstance(value, np.ndarray):
        return (value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if hasattr(value, "__dataclass_fields__"):
        return {name: _plain(getattr(value, name)) for name in value.__dataclass_fields__}
    return value


@pytest.fixture(scope="module")
def shard(tmp_path_factory):
    shard = Shard(tmp_path_factory.mktemp("ckpt"))
    worker = PSClient([shard.address], deadline_s=20, token=shard.token())
    worker.init_model(VALUES, ADAM, tables=[TABLE], options=OPTIONS, worker_id=0)
    for sequence in range(1, LAST_SEQUENCE + 1):
        worker.push_gradients(0, sequence, [sequence - 1], {
            "w": np.full((4, 3), 0.1, np.float32), "b": np.ones(3, np.float32),
            "emb": tensor_codec.Slices(np.ones((2, 4), np.float32), np.array([3, 7]),
                                       (0, 4)),
        }, deltas={"steps": np.ones((), np.float32)})
    worker.close()
    yield shard
    shard.close()


def dense(name, array):
    return tensor_codec.encode(name, np.asarray(array))


def sparse(name, rows, ids, dense_shape=(0, 0)):
    return tensor_codec.encode_slices(name, np.asarray(rows), np.asarray(ids), dense_shape)


def tensor(name="w", dtype=tensor_pb2.DT_FLOAT32, shape=(4, 3), content=None):
    content = bytes(4 * math.prod(shape)) if content is None else content
    return tensor_pb2.Tensor(name=name, dtype=dtype, shape=shape, content=content)


def push(*gradients, sequence=LAST_SEQUENCE, version=0, deltas=(), worker_id=0,
         incarnation=0):
    return pserver_pb2.PushGradientsRequest(worker_id=worker_id, sequence=sequence,
                                            model_version=version, gradients=gradients,
                                            deltas=deltas, incarnation=incarnation)


def init(*tensors, tables=(), optimizer=ADAM, worker_id=0):
    return pserver_pb2.InitModelRequest(
        dense=tensors or [dense(n, v) for n, v in VALUES.items()], optimizer_config=optimizer,
        embedding_tables=tables, variables=OPTIONS, worker_id=worker_id)


def table(**fields):
    spec = pserver_pb2.EmbeddingTableSpec()
    spec.CopyFrom(TABLE)
    for key, value in fields.items():
        setattr(spec, key, value)
    return spec


def bomb_push(shard):
    """A streamed push whose one chunk, 14 bytes of lz4, announces a 256 MiB tensor:
    refused from what it announces, before 256 MiB are allocated."""
    options = tensor_stream.TransferOptions(compression="lz4")
    frames = list(tensor_stream.push_parts(
        pserver_pb2.PushHeader(worker_id=0, sequence=LAST_SEQUENCE + 1),
        options.encode([("w", np.zeros(256, np.float32))]), options))
    frame = chunking.decode_frame(frames[0], pserver_pb2.PushGradientsPart)
    huge = 256 << 20
    for piece in frame.message.pieces:
        if piece.HasField("header"):
            piece.header.shape[:] = [huge // 4]
            piece.header.content_size = huge
        else:
            piece.chunk.raw_size = huge
    return [chunking.encode_frame(frame)]


def stream_frames(corrupt, then_pull=None, value=None):
    options = tensor_stream.TransferOptions(compression="none")
    frames = list(tensor_stream.push_parts(
        pserver_pb2.PushHeader(worker_id=0, sequence=LAST_SEQUENCE + 1, then_pull=then_pull),
        options.encode([("w", np.ones((4, 3), np.float32) if value is None else value)]),
        options))
    return corrupt(frames)


def push_pull(corrupt=lambda frames: frames, value=None):
    """A PushPullStream request: a streamed push that asks `then_pull`."""
    return lambda shard: stream_frames(corrupt, pserver_pb2.PullDenseRequest(), value)


def flip_last_byte(frames):
    return [frames[0][:-1] + bytes([frames[0][-1] ^ 0xFF])]


def without_header(frames):
    frame = chunking.decode_frame(frames[0], pserver_pb2.PushGradientsPart)
    frame.message.ClearField("header")
    return [chunking.encode_frame(frame)]


WORKER, MASTER, OTHER_WORKER = ("worker", 0), ("master", 0), ("worker", 1)
CLIENT_STREAMS = ("PushGradientsStream", "PushPullStream")
INVALID, DENIED = {CODES.INVALID_ARGUMENT}, {CODES.PERMISSION_DENIED}

# name -> (caller, method, request or a function of the shard giving it, allowed codes)
KINDS = {
    "InitModel as another worker": (OTHER_WORKER, "InitModel", init(), DENIED),
    "InitModel from the master": (MASTER, "InitModel", init(), DENIED),
    "InitModel empty name": (WORKER, "InitModel", init(dense("", [1.0])), INVALID),
    "InitModel repeated name": (WORKER, "InitModel",
                                init(dense("w", [1.0]), dense("w", [1.0])), INVALID),
    "InitModel unknown dtype enum": (WORKER, "InitModel", init(tensor(dtype=99)), INVALID),
    "InitModel negative dim": (WORKER, "InitModel", init(tensor(shape=(-4, -3))), INVALID),
    "InitModel overflowing shape": (WORKER, "InitModel",
                                    init(tensor(shape=(2**62, 2**62), content=b"")), INVALID),
    "InitModel bytes short of the shape": (WORKER, "InitModel",
                                           init(tensor(content=b"\0" * 5)), INVALID),
    "InitModel sparse value": (WORKER, "InitModel", init(sparse("w", [[1.0]], [0])), INVALID),
    "InitModel table dim 2**40": (WORKER, "InitModel", init(tables=[table(dim=2**40)]),
                                  INVALID),
    "InitModel table dim 0": (WORKER, "InitModel", init(tables=[table(dim=0)]), INVALID),
    "InitModel table dtype float99": (WORKER, "InitModel", init(tables=[table(dtype="float99")]),
                                      INVALID),
    "InitModel optimizer not JSON": (WORKER, "InitModel", init(optimizer="{adam"), INVALID),
    "InitModel optimizer of no class": (WORKER, "InitModel",
                                        init(optimizer='{"class_name": "Nope"}'), INVALID),
    "Push as another worker": (OTHER_WORKER, "PushGradients", push(), DENIED),
    "Push from the master": (MASTER, "PushGradients", push(), DENIED),
    "Push unknown variable": (WORKER, "PushGradients", push(dense("nope", [1.0])), INVALID),
    "Push wrong shape": (WORKER, "PushGradients", push(dense("w", np.ones(12, "f4"))), INVALID),
    "Push delta of the wrong shape": (WORKER, "PushGradients",
                                      push(deltas=[dense("steps", np.ones(3, "f4"))]), INVALID),
    "Push NaN": (WORKER, "PushGradients",
                 push(dense("b", [np.nan, 0, 0]), sequence=LAST_SEQUENCE + 1), INVALID),
    "Push +Inf table row": (WORKER, "PushGradients",
                            push(sparse("emb", [[np.inf, 0, 0, 0]], [1]),
                                 sequence=LAST_SEQUENCE + 1), INVALID),
    "Push sparse id -1": (WORKER, "PushGradients",
                          push(sparse("w", np.ones((2, 3), "f4"), [0, -1], (4, 3)),
                               sequence=LAST_SEQUENCE + 1), INVALID),
    "Push sparse id past the rows": (WORKER, "PushGradients",
                                     push(sparse("w", np.ones((1, 3), "f4"), [4], (4, 3))),
                                     INVALID),
    "Push float ids": (WORKER, "PushGradients",
                       push(tensor_pb2.Tensor(name="emb", dtype=tensor_pb2.DT_FLOAT32,
                                              shape=(1, 4), content=bytes(16),
                                              ids=np.float32([1]).tobytes(),
                                              dense_shape=(0, 4))), INVALID),
    "Push table gradient dense": (WORKER, "PushGradients", push(dense("emb", np.ones((1, 4)))),
                                  INVALID),
    "Push table rows of the wrong width": (WORKER, "PushGradients",
                                           push(sparse("emb", np.ones((1, 5), "f4"), [1])),
                                           INVALID),
    "Push table id past input_dim": (WORKER, "PushGradients",
                                     push(sparse("emb", np.ones((1, 4), "f4"), [100])), INVALID),
    "Push delta for a trainable variable": (WORKER, "PushGradients",
                                            push(deltas=[dense("b", np.ones(3, "f4"))]),
                                            INVALID),
    "Push gradient for a non-trainable variable": (WORKER, "PushGradients",
                                                   push(dense("steps", np.float32(1))), INVALID),
    "Push a name twice": (WORKER, "PushGradients",
                          push(dense("b", np.ones(3, "f4")), dense("b", np.ones(3, "f4"))),
                          INVALID),
    "Push a version from the future": (WORKER, "PushGradients", lambda shard: push(
        dense("b", np.ones(3, "f4")), version=10**12, sequence=LAST_SEQUENCE + 1,
        incarnation=shard.parameters.incarnation), INVALID),
    "Push float64 1e300 for a float32 variable": (WORKER, "PushGradients", push(
        dense("b", np.array([1e300, 0, 0])), sequence=LAST_SEQUENCE + 1), INVALID),
    "Push float64 1e300 for float32 table rows": (WORKER, "PushGradients", push(
        sparse("emb", np.array([[1e300, 0, 0, 0]]), [1]), sequence=LAST_SEQUENCE + 1),
        INVALID),
    "Push sequence 2**63-1": (WORKER, "PushGradients",
                              push(dense("b", np.ones(3, "f4")), sequence=2**63 - 1), INVALID),
    "Push negative sequence": (WORKER, "PushGradients",
                               push(dense("b", np.ones(3, "f4")), sequence=-1), INVALID),
    "Push an lz4 bomb": (WORKER, "PushGradientsStream", bomb_push, INVALID),
    "Stream corrupt checksum": (WORKER, "PushGradientsStream",
                                lambda shard: stream_frames(flip_last_byte), INVALID),
    "Stream without header": (WORKER, "PushGradientsStream",
                              lambda shard: stream_frames(without_header), INVALID),
    "Stream garbage frame": (WORKER, "PushGradientsStream",
                             lambda shard: [b"\xff" * 64], INVALID),
    "PushPull without then_pull": (WORKER, "PushPullStream",
                                   lambda shard: stream_frames(lambda frames: frames), INVALID),
    "PushPull corrupt checksum": (WORKER, "PushPullStream", push_pull(flip_last_byte),
                                  INVALID),
    "PushPull without header": (WORKER, "PushPullStream", push_pull(without_header), INVALID),
    "PushPull NaN": (WORKER, "PushPullStream",
                     push_pull(value=np.full((4, 3), np.nan, np.float32)), INVALID),
    "PushPull wrong shape": (WORKER, "PushPullStream", push_pull(value=np.ones(12, "f4")),
                             INVALID),
    "PushPull from the master": (MASTER, "PushPullStream", push_pull(), DENIED),
    "PushPull as another worker": (OTHER_WORKER, "PushPullStream", push_pull(), DENIED),
    "PullEmbedding unknown table": (WORKER, "PullEmbedding", pserver_pb2.PullEmbeddingRequest(
        ids=[dense("nope", np.array([1], np.int64))]), INVALID),
    "PullEmbedding float ids": (WORKER, "PullEmbedding", pserver_pb2.PullEmbeddingRequest(
        ids=[dense("emb", np.array([1.5], np.float32))]), INVALID),
    "PullEmbedding 2-D ids": (WORKER, "PullEmbedding", pserver_pb2.PullEmbeddingRequest(
        ids=[dense("emb", np.ones((2, 2), np.int64))]), INVALID),
    "PullTable negative rows_per_chunk": (MASTER, "PullTable", pserver_pb2.PullTableRequest(
        table="emb", rows_per_chunk=-1), INVALID),
    "PullTable unknown table": (MASTER, "PullTable", pserver_pb2.PullTableRequest(table="nope"),
                                INVALID),
    "PullTable from a worker": (WORKER, "PullTable", pserver_pb2.PullTableRequest(table="emb"),
                                DENIED),
    "PrepareCheckpoint NaN hold": (MASTER, "PrepareCheckpoint",
                                   pserver_pb2.PrepareCheckpointRequest(checkpoint_id=1,
                                                                        hold_s=math.nan),
                                   INVALID),
    "PrepareCheckpoint a week's hold": (MASTER, "PrepareCheckpoint",
                                        pserver_pb2.PrepareCheckpointRequest(checkpoint_id=1,
                                                                             hold_s=604800),
                                        INVALID),
    "SaveCheckpoint from a worker": (WORKER, "SaveCheckpoint", pserver_pb2.SaveCheckpointRequest(
        checkpoint_id=1, num_ps=1, without_cut=True), DENIED),
    "LearningRate from a worker": (WORKER, "LearningRate", pserver_pb2.LearningRateRequest(
        learning_rate=10.0), DENIED),
    "LearningRate NaN": (MASTER, "LearningRate",
                         pserver_pb2.LearningRateRequest(learning_rate=math.nan), INVALID),
    "LearningRate negative": (MASTER, "LearningRate",
                              pserver_pb2.LearningRateRequest(learning_rate=-1e-3), INVALID),
    "SaveCheckpoint id 0": (MASTER, "SaveCheckpoint", pserver_pb2.SaveCheckpointRequest(
        checkpoint_id=0, num_ps=1, without_cut=True), INVALID),
    "SaveCheckpoint num_ps 2**31-1": (MASTER, "SaveCheckpoint", pserver_pb2.SaveCheckpointRequest(
        checkpoint_id=1, num_ps=2**31 - 1, without_cut=True), INVALID),
}
STRANGERS = {"no credential": None, "garbage credential": "worker/0/0/00",
             "another job's credential": auth.credential(auth.new_secret(), JOB,
                                                         auth.Identity(auth.Role.WORKER, 0))}


def answer(stub, method, request):
    """The status code of `method(request)` (OK when it returns)."""
    try:
        result = getattr(stub, method)(request)
        if not isinstance(result, (bytes, tuple)) and hasattr(result, "__iter__") \
                and not hasattr(result, "SerializeToString"):
            list(result)  # a server stream: its status comes at its end
        return CODES.OK
    except grpc.RpcError as error:
        return error.code(), error.details()


def assert_still_serving(shard):
    client = PSClient([shard.address], deadline_s=20, token=shard.token())
    try:
        assert client.pull_dense()[0]
    finally:
        client.close()


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_hostile_request_is_refused_by_name_and_changes_nothing(shard, kind):
    (role, index), method, request, codes = KINDS[kind]
    before = shard.state()
    request = request(shard) if callable(request) else request
    if method in CLIENT_STREAMS:
        request = iter(request)
    got = answer(shard.stub(shard.token(role, index)), method, request)
    assert got != CODES.OK and got[0] in codes, (kind, got)
    assert got[1], "the refusal names what is wrong"
    assert shard.state() == before, kind
    assert_still_serving(shard)


@pytest.mark.parametrize("stranger", sorted(STRANGERS))
def test_strangers_are_refused_on_every_method(shard, stranger):
    before = shard.state()
    stub = shard.stub(STRANGERS[stranger])
    for method in AUTHORITY:
        request = pserver_pb2.DESCRIPTOR.services_by_name["PServer"].methods_by_name[method]
        raw = shard.raw(STRANGERS[stranger], method) if "Stream" not in method else None
        if raw is not None:
            got = answer(type("S", (), {"m": staticmethod(raw)}), "m", b"")
        else:
            got = answer(stub, method, iter([b""]) if method in CLIENT_STREAMS
                         else pserver_pb2.PullDenseRequest())
        assert got != CODES.OK and got[0] == CODES.UNAUTHENTICATED, (method, got, request.name)
    assert shard.state() == before
    assert_still_serving(shard)


NAMED = {CODES.OK, CODES.INVALID_ARGUMENT, CODES.PERMISSION_DENIED,
         CODES.FAILED_PRECONDITION, CODES.RESOURCE_EXHAUSTED}
DTYPES = st.sampled_from([*tensor_pb2.DataType.values(), 7, 99, -1])
SHAPES = st.lists(st.integers(-3, 2**40).filter(lambda d: d != 0) | st.integers(0, 5),
                  max_size=4)
NAMES = st.sampled_from(["w", "b", "steps", "emb", "", "nope"])


@st.composite
def random_tensors(draw):
    message = tensor_pb2.Tensor(name=draw(NAMES), dtype=draw(DTYPES), shape=draw(SHAPES),
                                content=draw(st.binary(max_size=64)))
    if draw(st.booleans()):
        message.ids = draw(st.binary(max_size=32))
        message.dense_shape.extend(draw(SHAPES))
    return message


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(gradients=st.lists(random_tensors(), max_size=3),
       deltas=st.lists(random_tensors(), max_size=2),
       sequence=st.integers(0, LAST_SEQUENCE), version=st.integers(-2**63, 2**63 - 1))
def test_random_pushes_never_break_the_shard(shard, gradients, deltas, sequence, version):
    """At or below the last applied sequence, a push that passes every check is a duplicate:
    whatever is accepted or refused, nothing changes."""
    before = shard.state()
    got = answer(shard.stub(shard.token()), "PushGradients",
                 push(*gradients, deltas=deltas, sequence=sequence, version=version))
    assert got == CODES.OK or got[0] in NAMED, got
    assert shard.state() == before


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(tensors=st.lists(random_tensors(), min_size=1, max_size=3),
       dim=st.integers(-2**62, 2**62), input_dim=st.integers(-2**62, 2**62),
       dtype=st.text(max_size=12))
def test_random_init_requests_never_break_the_shard(shard, tensors, dim, input_dim, dtype):
    before = shard.state()
    got = answer(shard.stub(shard.token()), "InitModel",
                 init(*tensors, tables=[table(dim=dim, input_dim=input_dim, dtype=dtype)]))
    assert got == CODES.OK or got[0] in NAMED, got
    assert shard.state() == before


UNARY = ["InitModel", "PullDense", "PushGradients", "PullEmbedding", "PrepareCheckpoint",
         "ReleaseCheckpoint", "SaveCheckpoint"]


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(UNARY), payload=st.binary(max_size=200))
def test_random_bytes_to_every_method_never_break_the_shard(shard, method, payload):
    """Bytes that are no message, or a message of random fields, from the master (who may
    call the checkpoint methods) or a worker. Checkpoint calls may succeed (a hold, a save
    of the shard as it is): they change no parameter either."""
    role = "master" if "Checkpoint" in method else "worker"
    before = shard.state()
    raw = shard.raw(shard.token(role), method)
    got = answer(type("S", (), {"m": staticmethod(raw)}), "m", payload)
    assert got == CODES.OK or got[0] in NAMED | {CODES.INTERNAL}, got
    if got != CODES.OK and got[0] == CODES.INTERNAL:
        assert "deserializ" in got[1].lower(), got  # gRPC's own: not a message at all
    if method == "PrepareCheckpoint" and got == CODES.OK:
        shard.parameters.release_checkpoint(
            pserver_pb2.PrepareCheckpointRequest.FromString(payload).checkpoint_id)
    assert shard.state() == before
    assert_still_serving(shard)


def test_an_lz4_bomb_is_refused_for_what_it_announces(shard):
    code, details = answer(shard.stub(shard.token()), "PushGradientsStream",
                           iter(bomb_push(shard)))
    assert code == CODES.INVALID_ARGUMENT
    assert "decompress to 268435456 bytes, as announced" in details, details
