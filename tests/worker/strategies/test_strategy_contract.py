"""What every registered update strategy guarantees, run against each: a minibatch is
applied once on every shard; one a shard refuses as stale is recomputed and resent to that
shard alone; one refused for another reason is given up, naming the shards that never
applied it; `after_landed` calls run once the push has landed. Real shards on 127.0.0.1,
a real PSClient and Trainer."""

import numpy as np
import pytest

from elastic_keras.common.errors import PushRefused
from elastic_keras.common.ps_client import PSClient
from elastic_keras.proto import pserver_pb2
from elastic_keras.worker import strategies
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import SPEC, Interloper, batch, counted

NAMES = sorted(strategies.STRATEGIES)


class RefusingShard1(PSClient):
    """Shard 1 of two refuses every push for a reason other than staleness (nothing is sent
    to it)."""

    def push_gradients(self, *args, shards=None, **kwargs):
        shards = range(self.num_ps) if shards is None else shards
        responses = super().push_gradients(*args, shards=[i for i in shards if i != 1],
                                           **kwargs)
        if 1 in shards:
            responses[1] = pserver_pb2.PushGradientsResponse(accepted=False,
                                                             reason="no room on shard 1")
        return responses


def _train_one(client, name):
    """Trains one minibatch with strategy `name` and waits for it to land; returns (the
    trainer, what `after_landed` saw)."""
    trainer = Trainer(SPEC, client, worker_id=0, strategy=name)
    landed = []
    loss = trainer.train_minibatch(*batch(np.random.default_rng(0)))
    trainer.after_landed(lambda: landed.append(loss))
    trainer.flush()
    return trainer, landed


@pytest.mark.parametrize("name", NAMES)
def test_a_minibatch_is_pushed_and_applied_once_on_every_shard(shards, name):
    parameters, addresses, _ = shards
    client = PSClient(addresses)
    try:
        trainer, landed = _train_one(client, name)
    finally:
        client.close()
    assert len(landed) == 1 and isinstance(landed[0], float)
    assert trainer.stale_pushes == 0
    assert [p.applied_pushes for p in parameters] == [{0: 1}, {0: 1}]
    assert counted(addresses) == 1


@pytest.mark.parametrize("name", NAMES)
def test_a_push_refused_as_stale_is_resent_to_the_refusing_shard_alone(shards, name):
    parameters, addresses, _ = shards
    client = Interloper(addresses)
    try:
        trainer, landed = _train_one(client, name)
    finally:
        client.close()
    assert len(landed) == 1
    assert trainer.stale_pushes == 1
    assert parameters[0].applied_pushes == {0: 1}
    assert parameters[1].applied_pushes == {0: 1, 9: 2}
    assert counted(addresses) == 1  # one minibatch, one delta, though computed twice


@pytest.mark.parametrize("name", NAMES)
def test_a_push_refused_for_another_reason_names_the_shards_that_never_applied_it(shards,
                                                                                  name):
    parameters, addresses, _ = shards
    client = RefusingShard1(addresses)
    try:
        with pytest.raises(PushRefused, match="no room on shard 1") as info:
            _train_one(client, name)
    finally:
        client.close()
    assert info.value.dropped == {1: "no room on shard 1"}
    assert [p.applied_pushes for p in parameters] == [{0: 1}, {}]
