"""What a shard refuses over real loopback gRPC, and that it stays up and unchanged: bounds
from its `PayloadLimits`, non-finite values, versions it never gave, bad chunk sizes, failed
applies, and long-polling pulls that must not starve the server."""

import concurrent.futures
import contextlib

import grpc
import keras
import numpy as np
import pytest

from elastic_keras.common import rpc
from elastic_keras.common.transfer import tensor_codec, tensor_stream
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.proto import pserver_pb2
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server

from tests.ps.test_ps_service import GRADS, init, optimizer_config, pull, push


@contextlib.contextmanager
def serving(parameters, threads=rpc.DEFAULT_SERVER_THREADS, **servicer_args):
    """(stub, parameters) of a shard served on loopback with `threads` server threads."""
    servicer = PServerServicer(parameters, **servicer_args)
    server, port = rpc.create_server([lambda s: add_to_server(servicer, s)],
                                     max_workers=threads)
    channel = rpc.create_channel(f"127.0.0.1:{port}", "elastic_keras.PServer", deadline_s=30)
    try:
        yield rpc.Stub(channel, tensor_stream.PSERVER)
    finally:
        channel.close()
        server.stop(0)


def refused(call, code=grpc.StatusCode.INVALID_ARGUMENT):
    """The details of `call`'s error, which must have status `code`."""
    with pytest.raises(grpc.RpcError) as info:
        call()
    assert info.value.code() == code, info.value.details()
    return info.value.details()


NAN_KERNEL = GRADS["dense/kernel"].copy()
NAN_KERNEL[0, :2] = np.nan
NAN_KERNEL[1, 0] = np.inf


def test_a_non_finite_push_is_refused_counted_and_its_sequence_stays_free():
    parameters = Parameters()
    with serving(parameters) as stub:
        init(stub)
        before = pull(stub)
        details = refused(lambda: push(stub, {**GRADS, "dense/kernel": NAN_KERNEL}, sequence=3))
        assert ("Gradient 'dense/kernel'" in details and "2 NaN and 1 Inf" in details
                and "Received:" in details)
        details = refused(lambda: push(stub, GRADS, {"bn/moving_mean": np.full(3, np.inf,
                                                                                np.float32)},
                                       sequence=3))
        assert "Delta 'bn/moving_mean'" in details and "0 NaN and 3 Inf" in details
        assert parameters.non_finite_pushes == 2
        assert pull(stub)[1] == 0 and parameters.applied_sequence(0) == 0
        np.testing.assert_array_equal(pull(stub)[2]["dense/kernel"], before[2]["dense/kernel"])
        assert push(stub, GRADS, sequence=3).model_version == 1  # the sequence was free


def test_a_skipped_non_finite_push_is_acknowledged_and_never_applied():
    parameters = Parameters(limits=PayloadLimits(non_finite_gradients="skip"))
    with serving(parameters) as stub:
        init(stub)
        before = pull(stub)
        answer = push(stub, {**GRADS, "dense/kernel": NAN_KERNEL}, sequence=3)
        assert answer.accepted and answer.reason.startswith("skipped") and answer.model_version == 0
        assert parameters.non_finite_pushes == 1 and parameters.applied_sequence(0) == 3
        assert push(stub, GRADS, sequence=3).reason == "duplicate"  # never applied later
        np.testing.assert_array_equal(pull(stub)[2]["dense/bias"], before[2]["dense/bias"])


def test_a_push_of_a_version_this_run_never_gave_is_refused():
    with serving(Parameters()) as stub:
        init(stub)
        incarnation = stub.PullDense(pserver_pb2.PullDenseRequest()).incarnation
        request = pserver_pb2.PushGradientsRequest(
            worker_id=0, sequence=1, model_version=4, incarnation=incarnation,
            gradients=[tensor_codec.encode(n, v) for n, v in GRADS.items()])
        details = refused(lambda: stub.PushGradients(request))
        assert "model_version must be one this shard gave" in details
        assert "Received: model_version=4" in details
        request.model_version = -1
        assert "model_version=-1" in refused(lambda: stub.PushGradients(request))
        request.model_version = 0
        assert stub.PushGradients(request).model_version == 1


def test_init_model_is_bounded_by_the_limits():
    parameters = Parameters(limits=PayloadLimits(max_variable_elements=10))
    with serving(parameters) as stub:
        details = refused(lambda: init(stub))  # dense/kernel has 12 elements
        assert "'dense/kernel'" in details and "at most 10 elements" in details
        assert "shape=[4, 3]" in details and not parameters.initialized


@pytest.mark.parametrize("spec, problem", [
    (dict(dim=1 << 40), "dim may be at most 65536 (--max-embedding-dim). Received: "
     "dim=1099511627776"),
    (dict(dim=4, dtype="no-such-dtype"), "rows must be floating point"),
])
def test_a_bad_table_spec_is_refused_and_the_shard_stays_empty(stub, spec, problem):
    request = pserver_pb2.InitModelRequest(
        dense=[tensor_codec.encode("w", np.zeros(2, np.float32))],
        optimizer_config=optimizer_config(keras.optimizers.SGD(0.1)),
        embedding_tables=[pserver_pb2.EmbeddingTableSpec(name="e", **spec)])
    assert problem in refused(lambda: stub.InitModel(request))
    assert not stub.PullDense(pserver_pb2.PullDenseRequest()).initialized


def test_pull_table_refuses_a_negative_chunk_size(stub):
    request = pserver_pb2.InitModelRequest(
        dense=[tensor_codec.encode("w", np.zeros(2, np.float32))],
        optimizer_config=optimizer_config(keras.optimizers.SGD(0.1)),
        embedding_tables=[pserver_pb2.EmbeddingTableSpec(name="e", dim=4)])
    stub.InitModel(request)
    details = refused(lambda: list(stub.PullTable(pserver_pb2.PullTableRequest(
        table="e", rows_per_chunk=-5))))
    assert "rows_per_chunk must be 1 or more" in details and "rows_per_chunk=-5" in details
    assert list(stub.PullTable(pserver_pb2.PullTableRequest(table="e"))) == []  # 0: default


def test_pushes_are_bounded_by_max_push_bytes_unary_and_streamed():
    parameters = Parameters(limits=PayloadLimits(max_push_bytes=40))  # the kernel is 48 bytes
    with serving(parameters) as stub:
        init(stub)
        assert "at most 40 bytes" in refused(lambda: push(stub, GRADS))
        options = tensor_stream.TransferOptions("none", 1024)
        parts = tensor_stream.push_parts(
            pserver_pb2.PushHeader(worker_id=0, sequence=1),
            options.encode(GRADS.items()), options)
        assert "at most 40 bytes" in refused(lambda: stub.PushGradientsStream(parts))
        assert push(stub, {"dense/bias": GRADS["dense/bias"]}).model_version == 1


def test_a_failed_apply_is_internal_and_leaves_the_sequence_free(monkeypatch):
    parameters = Parameters()
    with serving(parameters) as stub:
        init(stub)
        applier = parameters._model.applier
        real = applier.apply
        monkeypatch.setattr(applier, "apply", lambda *a: (_ for _ in ()).throw(
            RuntimeError("device lost")))
        details = refused(lambda: push(stub, GRADS, sequence=4), grpc.StatusCode.INTERNAL)
        assert "device lost" in details and "version 0" in details
        assert parameters.applied_sequence(0) == 0 and parameters.version == 0
        monkeypatch.setattr(applier, "apply", real)
        assert push(stub, GRADS, sequence=4).model_version == 1


def test_waiting_pulls_never_take_every_server_thread():
    """Four threads, two waiting slots: more pulls waiting for a round than slots are
    answered at once, and a plain pull and a push are still served at once."""
    with serving(Parameters(), threads=4, max_waiting_pulls=2) as stub:
        init(stub)
        waiting = pserver_pb2.PullDenseRequest(known_version=0, min_version=5)
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            calls = [pool.submit(stub.PullDense, waiting, timeout=20) for _ in range(6)]
            # Which two pulls take the slots is up to the scheduler: four are answered.
            done, held = concurrent.futures.wait(calls, timeout=10,
                                                 return_when=concurrent.futures.ALL_COMPLETED)
            assert len(done) == 4 and len(held) == 2
            assert all(c.result().model_version == 0 for c in done)
            assert pull(stub)[1] == 0
            assert push(stub, GRADS).model_version == 1
            assert not any(c.done() for c in held)  # still waiting for version 5
            for sequence in range(2, 6):
                push(stub, GRADS, sequence=sequence)
            assert {c.result(timeout=10).model_version for c in held} == {5}


def test_a_push_of_negative_ids_for_a_dense_variable_changes_nothing():
    parameters = Parameters()
    with serving(parameters) as stub:
        init(stub)
        before = pull(stub)[2]["embedding/embeddings"]
        bad = tensor_codec.encode_slices("embedding/embeddings", np.ones((2, 2), np.float32),
                                         [3, -1], (0, 2))
        details = refused(lambda: push(stub, [bad], sequence=2))
        assert "row ids must be in [0, 10)" in details and "Received: id -1" in details
        np.testing.assert_array_equal(pull(stub)[2]["embedding/embeddings"], before)
        good = tensor_codec.encode_slices("embedding/embeddings", np.ones((2, 2), np.float32),
                                          [3, 1], (0, 2))
        assert push(stub, [good], sequence=2).model_version == 1  # the sequence was free
