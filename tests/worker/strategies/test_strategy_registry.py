"""Update strategies are chosen by name, in one place: `strategies.name_for` picks a
worker's from its config, `strategies.create` builds it."""

import pytest

from elastic_keras.common.config import WorkerConfig
from elastic_keras.worker import strategies
from elastic_keras.worker.strategies import UpdateStrategy
from elastic_keras.worker.trainer import Trainer
from tests.worker.shards import SPEC
from tests.worker.strategies.fake_replica import FakeReplica


def _config(**flags):
    return WorkerConfig(worker_id=0, master_addr="127.0.0.1:1", model_def="m", **flags)


@pytest.mark.parametrize("flags, name", [
    ({"sync": True}, "sync"),
    ({"sync": True, "overlap": True}, "sync"),
    ({}, "async"),
    ({"overlap": True}, "overlap"),
])
def test_a_worker_config_names_its_strategy(flags, name):
    assert strategies.name_for(_config(**flags)) == name
    assert name in strategies.STRATEGIES


@pytest.mark.parametrize("name", sorted(strategies.STRATEGIES))
def test_each_strategy_is_an_update_strategy_under_its_own_name(name):
    strategy = strategies.create(name, FakeReplica(), max_stale_retries=3)
    assert isinstance(strategy, UpdateStrategy)
    assert type(strategy).name == name


def test_an_unknown_name_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"expected one of \['async', 'overlap', 'sync'\]. "
                                         r"Received: 'local_sgd'"):
        strategies.create("local_sgd", FakeReplica())
    with pytest.raises(ValueError, match="Received: 'local_sgd'"):
        Trainer(SPEC, ps_client=None, worker_id=0, strategy="local_sgd")
