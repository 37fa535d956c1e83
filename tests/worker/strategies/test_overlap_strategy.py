"""Asynchronous updates with communication overlapped: a step's push and the pull after it
run in the background while the next step computes; a push refused as stale is recomputed
and resent before the next push, and `after_landed` calls wait for it. A `FakeReplica`
stands in for the model, then real shards on 127.0.0.1 with a real PSClient and Trainer."""

import numpy as np
import pytest

from elastic_keras.common.errors import PushRefused
from elastic_keras.common.ps_client import PSClient
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.worker.strategies import Minibatch
from elastic_keras.worker.strategies.overlap import Overlapped
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import SPEC, batch, serve
from tests.worker.strategies.fake_replica import FakeReplica, refused, stale


def test_the_next_step_computes_before_the_previous_push_is_taken_in():
    replica = FakeReplica()
    strategy = Overlapped(replica)
    assert strategy.train(Minibatch(None, 1.0, 1)) == 1.0
    assert strategy.train(Minibatch(None, 2.0, 2)) == 2.0
    strategy.flush()
    events = replica.events
    # One pull before the first step; after it, the values come with each push (fetch).
    assert events[:2] == [("pull", None), ("compute", 1.0)]
    assert [e for e in events if e[0] == "pull"] == [("pull", None)]
    assert events.index(("compute", 2.0)) < events.index(("assign",))
    assert events.index(("assign",)) < events.index(("push", 2, [0, 1]))
    assert events.count(("assign",)) == 2


def test_a_call_after_a_push_refused_as_stale_waits_until_it_is_resent():
    replica = FakeReplica(answers=[{1: stale(5)}])
    strategy = Overlapped(replica)
    strategy.train(Minibatch(None, 1.0, 1))
    strategy.after_landed(lambda: replica.record("landed"))
    strategy.flush()
    events = replica.events
    assert events.index(("push", 1, [1])) < events.index(("landed",))
    assert events.count(("landed",)) == 1
    assert strategy.stale_pushes == 1


def test_a_push_refused_for_another_reason_fails_the_flush_and_drops_the_calls_after_it():
    replica = FakeReplica(answers=[{1: refused("no room")}])
    strategy = Overlapped(replica)
    strategy.train(Minibatch(None, 1.0, 1))
    strategy.after_landed(lambda: replica.record("landed"))
    with pytest.raises(PushRefused) as info:
        strategy.flush()
    assert info.value.dropped == {1: "no room"}
    strategy.flush()  # nothing is left waiting
    assert ("landed",) not in replica.events


def test_overlapped_pushes_refused_by_a_restarted_shard_are_recomputed_for_it(shards):
    """A shard that restarts from a snapshot refuses pushes computed against its earlier run;
    an overlapping worker resends those minibatches to it alone, recomputed."""
    parameters, addresses, servers = shards
    client = PSClient(addresses)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, strategy="overlap")
        rng = np.random.default_rng(2)
        for _ in range(3):
            trainer.train_minibatch(*batch(rng))
        trainer.flush()
        # Shard 1 restarts at its address: a new run of it, restored from a snapshot.
        restarted = Parameters(UpdatePolicy(), min_version=parameters[1].version)
        restarted.restore(parameters[1].snapshot())
        servers[1].stop(0).wait()
        servers[1], _ = serve(restarted, int(addresses[1].rsplit(":", 1)[1]))
        landed = []
        for step in range(4):
            trainer.train_minibatch(*batch(rng))
            trainer.after_landed(lambda k=step: landed.append(k))
        trainer.flush()
    finally:
        client.close()
    assert landed == [0, 1, 2, 3]
    assert trainer.stale_pushes >= 1
    assert parameters[0].applied_pushes == {0: 7}
    assert restarted.applied_pushes == {0: 7}  # 3 restored, 4 after: none lost or repeated
    assert restarted.version >= parameters[1].version
