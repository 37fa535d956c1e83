"""A minibatch is applied at most once on every shard, also when one shard refuses its push
as stale and another accepts it; non-trainable state moves once per minibatch. Real shards
on 127.0.0.1, a real PSClient and Trainer."""

import numpy as np
import pytest

from elastic_keras.common import partition
from elastic_keras.common.errors import PushRefused
from elastic_keras.common.ps_client import PSClient
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import SPEC, Interloper, batch, counted, custom_model


def test_a_push_refused_by_one_shard_is_resent_to_that_shard_alone(shards):
    parameters, addresses, _ = shards
    names = [v.path for v in custom_model().weights]
    assert {partition.dense_shard(n, 2) for n in names} == {0, 1}  # both shards hold some
    client = Interloper(addresses)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, max_stale_retries=2)
        rng = np.random.default_rng(0)
        for _ in range(3):
            trainer.train_minibatch(*batch(rng))
    finally:
        client.close()
    assert trainer.stale_pushes == 1
    # Three minibatches: each applied once on each shard (today's code applied the first
    # twice on shard 0, once for each try).
    assert parameters[0].applied_pushes == {0: 3}
    assert parameters[1].applied_pushes == {0: 3, 9: 2}
    assert [p.version for p in parameters] == [3, 5]
    assert counted(addresses) == 3  # one delta per minibatch, none lost or repeated


def test_a_minibatch_given_up_on_names_the_shards_that_never_applied_it(shards):
    parameters, addresses, _ = shards
    client = Interloper(addresses, pushes_before=2)
    try:
        trainer = Trainer(SPEC, client, worker_id=0, max_stale_retries=0)
        with pytest.raises(PushRefused) as info:
            trainer.train_minibatch(*batch(np.random.default_rng(1)))
    finally:
        client.close()
    assert info.value.dropped == {1: "stale"}
    assert parameters[0].applied_pushes == {0: 1}
    assert parameters[1].applied_pushes == {9: 2}


def test_a_relaunched_worker_numbers_its_minibatches_above_its_predecessors(shards):
    """Whatever its clock says: a predecessor's higher sequences would make every push of
    the new worker a "duplicate", silently dropped."""
    parameters, addresses, _ = shards
    client = PSClient(addresses)
    try:
        first = Trainer(SPEC, client, worker_id=3)
        first.train_minibatch(*batch(np.random.default_rng(4)))
        relaunched = Trainer(SPEC, client, worker_id=3)
        relaunched._sequence = 1  # a clock far behind the predecessor's
        relaunched.train_minibatch(*batch(np.random.default_rng(5)))
    finally:
        client.close()
    assert [p.applied_pushes for p in parameters] == [{3: 2}, {3: 2}]
