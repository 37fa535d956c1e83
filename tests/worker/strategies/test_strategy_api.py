"""What every update strategy inherits: `settle` recomputes a minibatch for the shards that
refuse it as stale and resends it to them alone, under its one sequence number; a refusal
for another reason gives the minibatch up. A `FakeReplica` stands in for the model."""

import pytest

from elastic_keras.common.errors import NonFiniteLossError, PushRefused
from elastic_keras.worker.strategies import Minibatch
from elastic_keras.worker.strategies.api import why
from elastic_keras.worker.strategies.asynchronous import Asynchronous
from tests.worker.strategies.fake_replica import FakeReplica, refused, stale

MINIBATCH = Minibatch(features=None, labels=2.0, sequence=7)


def test_a_stale_refusal_is_recomputed_against_the_refusing_shards_version_and_resent_to_it():
    replica = FakeReplica(answers=[{1: stale(5)}])
    strategy = Asynchronous(replica)
    loss, applied_at = strategy.settle(MINIBATCH, range(2))
    assert replica.events == [
        ("pull", None), ("compute", 2.0), ("push", 7, [0, 1]),
        ("pull", [0, 5]), ("compute", 2.0), ("push", 7, [1]),
    ]
    assert (loss, applied_at) == (2.0, {0: 3, 1: 5})
    assert strategy.stale_pushes == 1


def test_a_minibatch_still_stale_after_the_retries_is_given_up_naming_the_stale_shards():
    replica = FakeReplica(answers=[{1: stale(5)}] * 3)
    with pytest.raises(PushRefused, match="as stale 3 times in a row") as info:
        Asynchronous(replica, max_stale_retries=2).settle(MINIBATCH, range(2))
    assert info.value.dropped == {1: "stale"}
    assert [e for e in replica.events if e[0] == "push"] == [
        ("push", 7, [0, 1]), ("push", 7, [1]), ("push", 7, [1])]


def test_a_refusal_for_another_reason_is_not_retried_and_names_each_shard_not_applying_it():
    replica = FakeReplica(answers=[{0: stale(4), 1: refused("unknown variable 'x'")}])
    with pytest.raises(PushRefused, match="rejected the gradients: unknown variable 'x'") as info:
        Asynchronous(replica).settle(MINIBATCH, range(2))
    assert info.value.dropped == {0: "stale", 1: "unknown variable 'x'"}
    assert [e for e in replica.events if e[0] == "push"] == [("push", 7, [0, 1])]


def test_a_strategy_that_pushes_inline_has_landed_every_push_when_train_returns():
    replica = FakeReplica()
    strategy = Asynchronous(replica)
    assert strategy.train(MINIBATCH) == 2.0
    strategy.after_landed(lambda: replica.record("landed"))
    strategy.flush()
    assert replica.events[-2:] == [("push", 7, [0, 1]), ("landed",)]


def test_the_summary_gets_a_short_reason():
    assert why(stale(3)) == "stale"
    assert why(refused("x" * 300)) == "x" * 200


class NaNOnRecompute(FakeReplica):
    """A replica whose loss turns NaN from its `nan_from`-th computation on."""

    def __init__(self, nan_from, **kwargs):
        super().__init__(**kwargs)
        self._computations, self._nan_from = 0, nan_from

    def compute(self, features, labels):
        self._computations += 1
        if self._computations >= self._nan_from:
            raise NonFiniteLossError("The training loss is nan")
        return super().compute(features, labels)


def test_a_nan_first_computation_pushes_nothing_and_is_raised_as_it_is():
    replica = NaNOnRecompute(nan_from=1)
    with pytest.raises(NonFiniteLossError):
        Asynchronous(replica).settle(MINIBATCH, range(2))
    assert not [e for e in replica.events if e[0] == "push"]


def test_a_nan_recomputation_gives_the_minibatch_up_on_the_shards_still_waiting():
    """Shard 0 applied the minibatch; shard 1 refused it as stale and never will."""
    replica = NaNOnRecompute(nan_from=2, answers=[{1: stale(5)}])
    with pytest.raises(PushRefused, match="loss is nan") as info:
        Asynchronous(replica).settle(MINIBATCH, range(2))
    assert info.value.dropped == {1: "non_finite_loss"}
    assert isinstance(info.value.__cause__, NonFiniteLossError)


def test_a_nan_recomputation_of_an_overlapped_push_is_never_taken_for_a_fresh_one():
    replica = NaNOnRecompute(nan_from=1)
    with pytest.raises(PushRefused) as info:
        Asynchronous(replica).settle(MINIBATCH, [0, 1], fresh=False)
    assert info.value.dropped == {0: "non_finite_loss", 1: "non_finite_loss"}
