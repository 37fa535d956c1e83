"""A push that carries the next pull (`then_pull`), over gRPC to real shards on 127.0.0.1,
both unary (`PushGradients` with the values in its answer) and streamed (`PushPullStream`,
as pushes with a codec and models too large for one unary answer go): exactly once holds, a
synchronous push's pull waits for its round, and a worker trains on what its pushes bring
back without another call."""

import concurrent.futures
import json

import keras
import numpy as np
import pytest

from elastic_keras.common.ps_client import PSClient
from elastic_keras.common.transfer.tensor_stream import TransferOptions
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import SPEC, batch, serve

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))
INITIAL = {"w": np.ones(3, np.float32), "b": np.full(2, 2.0, np.float32)}  # one a shard


@pytest.fixture
def shards(request):
    """Two shards with the `UpdatePolicy` of the test's parameter (default: asynchronous),
    served on 127.0.0.1: yields (their `Parameters`, their addresses)."""
    policy = UpdatePolicy(**getattr(request, "param", {}))
    parameters = [Parameters(policy) for _ in range(2)]
    servers = [serve(p) for p in parameters]
    yield parameters, [f"127.0.0.1:{port}" for _, port in servers]
    for server, _ in servers:
        server.stop(0)


# How a client sends: "none" goes unary (the values are small), "snappy" streamed.
TRANSFERS = {"unary": TransferOptions(), "streamed": TransferOptions(compression="snappy")}


@pytest.fixture(params=sorted(TRANSFERS))
def transfer(request):
    return TRANSFERS[request.param]


@pytest.fixture
def client(shards, transfer):
    """A `PSClient` of `shards` that gave them `INITIAL` and pulled once."""
    client = PSClient(shards[1], transfer=transfer)
    client.init_model(INITIAL, SGD)
    client.pull_dense()
    yield client
    client.close()


def sync(grads_to_wait):
    return pytest.mark.parametrize("shards", [{"grads_to_wait": grads_to_wait}], indirect=True)


def _push(client, worker, sequence, versions, scale=1.0):
    gradients = {name: np.full_like(value, scale) for name, value in INITIAL.items()}
    return client.push_gradients(worker, sequence, versions, gradients, then_pull=True)


def _values(parameters):
    return {n: v for p in parameters for n, v in p.pull().dense.items()}


def test_a_retried_fused_push_is_applied_once_and_answers_its_pull_both_times(shards, client):
    parameters, _ = shards
    first = _push(client, 0, 5, [0, 0])
    pulls = [client.pulled(first)]
    again = _push(client, 0, 5, [0, 0])  # the same minibatch sent again
    pulls.append(client.pulled(again))
    assert client.pulled(first) is None  # a push's pull is taken once, after that push
    assert [r.accepted for r in first] == [True, True]
    assert [r.reason for r in again] == ["duplicate", "duplicate"]
    assert [p.version for p in parameters] == [1, 1]
    for initialized, versions, values in pulls:
        assert initialized and versions == [1, 1]
        for name, value in _values(parameters).items():
            np.testing.assert_array_equal(values[name], value)
    np.testing.assert_allclose(_values(parameters)["w"], [0.5] * 3)  # one step of SGD(0.5)


@sync(1)
def test_a_stale_synchronous_push_is_refused_whole_and_brings_the_current_values(shards,
                                                                                 client):
    parameters, _ = shards
    _push(client, 0, 1, [0, 0])  # worker 0 closes round 0 on both shards
    before = _values(parameters)
    stale = _push(client, 1, 1, [0, 0], scale=100.0)
    assert [(r.accepted, r.stale) for r in stale] == [(False, True), (False, True)]
    assert [p.version for p in parameters] == [1, 1]
    _, versions, values = client.pulled(stale)
    assert versions == [1, 1]
    for name, value in before.items():  # nothing of the stale push was applied anywhere
        np.testing.assert_array_equal(_values(parameters)[name], value)
        np.testing.assert_array_equal(values[name], value)


@sync(2)
def test_a_synchronous_push_waits_for_no_round_and_brings_the_values_as_they_are(shards,
                                                                                   client):
    parameters, _ = shards
    other = PSClient(client.addresses, transfer=client.transfer)
    other.pull_dense()
    first = _push(client, 0, 1, [0, 0], 1.0)  # answered at once: the round stays open
    assert all(r.accepted for r in first)
    assert client.pulled(first)[1] == [0, 0]  # of the version before the round
    closing = _push(other, 1, 1, [0, 0], 3.0)
    _, versions, values = other.pulled(closing)
    other.close()
    assert versions == [1, 1]  # this push closed the round
    np.testing.assert_allclose(values["w"], [0.0] * 3)  # 1 - 0.5 * mean(1, 3)


@sync(2)
def test_a_synchronous_worker_whose_push_left_the_round_open_pulls_and_waits(shards,
                                                                             transfer):
    _, addresses = shards
    trainer = Trainer(SPEC, PSClient(addresses, transfer=transfer), worker_id=0,
                      strategy="sync")
    rng = np.random.default_rng(1)
    trainer.train_minibatch(*batch(rng))  # its push joins round 0; the round stays open
    assert trainer._fetched.versions == [0, 0]
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        second = pool.submit(trainer.train_minibatch, *batch(rng))
        with pytest.raises(concurrent.futures.TimeoutError):
            second.result(timeout=0.5)  # its pull waits for the round: values of version 0
        other = Trainer(SPEC, PSClient(addresses), worker_id=1, strategy="sync")
        other.train_minibatch(*batch(rng))  # closes round 0
        second.result(timeout=30)
    assert trainer.model_version >= 1


@sync(1)
def test_a_synchronous_worker_holds_the_shards_values_after_every_step(shards, transfer,
                                                                       monkeypatch):
    _, addresses = shards
    parameters_of = PSClient(addresses)
    pulls = []
    original = PSClient.pull_dense
    monkeypatch.setattr(PSClient, "pull_dense",
                        lambda self, *a, **k: pulls.append(1) or original(self, *a, **k))
    trainer = Trainer(SPEC, PSClient(addresses, transfer=transfer), worker_id=0,
                      strategy="sync")
    rng = np.random.default_rng(0)
    for step in range(1, 5):
        trainer.train_minibatch(*batch(rng))
        # What the next step computes against came back with this step's push.
        fetched = trainer._fetched
        _, versions, shard_values = original(parameters_of)
        assert versions == fetched.versions == [step, step]
        assert sorted(fetched.values) == sorted(shard_values)
        for name, value in shard_values.items():
            np.testing.assert_array_equal(fetched.values[name], value, err_msg=name)
    assert len(pulls) == 1  # the first step's: every later one came with a push
    trainer.pull()
    assert len(pulls) == 1 and trainer.model_version == 4
    held = {n: v.numpy() for n, v in {**trainer._trainable, **trainer._fixed}.items()}
    for name, value in shard_values.items():
        np.testing.assert_array_equal(held[name], value, err_msg=name)
    parameters_of.close()


def test_a_fused_push_held_by_a_checkpoint_is_sent_again_and_brings_its_pull(shards, client):
    parameters, _ = shards
    assert client.prepare_checkpoint(1, hold_s=30) == {}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pushed = pool.submit(_push, client, 0, 1, [0, 0])
        with pytest.raises(concurrent.futures.TimeoutError):
            pushed.result(timeout=0.3)  # held, answered `held`, sent again and again
        assert [p.version for p in parameters] == [0, 0]
        client.release_checkpoint(1)
        responses = pushed.result(timeout=30)
    assert [r.accepted for r in responses] == [True, True]
    initialized, versions, values = client.pulled(responses)
    assert initialized and versions == [1, 1]
    np.testing.assert_allclose(values["w"], [0.5] * 3)
