"""How a worker's computed minibatches reach the parameter servers: the update strategy.

The `Trainer` computes a minibatch's gradients; its `UpdateStrategy` decides when it pulls,
when it pushes, what it waits for, and what happens to a push a shard refuses. A strategy
works on the model through the `Replica` interface, which the `Trainer` implements.

Exactly once. A minibatch's pushes carry one sequence number, however often they are sent.
A shard that refuses a push as stale (it moved on) gets the minibatch again, recomputed
against fresh values, under the same sequence (`UpdateStrategy.settle`); the shards that
accepted it get nothing more, and a shard that sees the sequence again answers "duplicate".
So every shard applies each minibatch at most once; one the worker gives up on
(`PushRefused`) names the shards that never applied it, which the job summary counts as
dropped.
"""

import abc
import dataclasses
import typing

from elastic_keras.common.errors import NonFiniteLossError, PushRefused
from elastic_keras.worker.failures import NON_FINITE_LOSS


@dataclasses.dataclass(frozen=True)
class Minibatch:
    """A minibatch to train, and the sequence number every push of it carries."""

    features: typing.Any
    labels: typing.Any
    sequence: int


@dataclasses.dataclass(frozen=True)
class Computed:
    """One computation of a minibatch: its loss, what its push carries, and the shards'
    `versions` (of their `incarnations`) it was computed against."""

    loss: float
    gradients: dict
    deltas: dict
    embedding_grads: dict
    versions: list
    incarnations: list


class Pulled(typing.NamedTuple):
    """The shards' dense values as one pull found them."""

    initialized: bool
    versions: list
    values: dict
    incarnations: list


class Replica(abc.ABC):
    """What an update strategy may ask of the worker's copy of the model.

    Every call to the shards waits through a parameter-server outage (see `Trainer`).
    """

    @property
    @abc.abstractmethod
    def num_ps(self):
        """The number of parameter-server shards."""

    @property
    @abc.abstractmethod
    def has_values(self):
        """Whether the model holds values pulled from the shards."""

    @abc.abstractmethod
    def pull(self):
        """Pulls the shards' values, at least of the versions `wait_for` asked, and assigns
        them to the model."""

    @abc.abstractmethod
    def wait_for(self, min_versions):
        """Makes later pulls wait until shard `i` reaches version `min_versions[i]`."""

    @abc.abstractmethod
    def compute(self, features, labels):
        """Runs the training step on the values the model holds; returns a `Computed`."""

    @abc.abstractmethod
    def push(self, sequence, computed, shards=None, then_pull=None):
        """Pushes `computed` as minibatch `sequence` to `shards` (default: all).

        Args:
            then_pull: the push may bring the shards' values back with its answer, as they
                are once it is answered (it waits for no round); the next `pull` or `fetch`
                takes them in place of calling the shards again, if they are of the versions
                `wait_for` asks.

        Returns:
            The shards' `PushGradientsResponse`s in shard order, None for a shard not pushed to.
        """

    @abc.abstractmethod
    def fetch(self):
        """The shards' latest values as a `Pulled` (those the last push brought back, if it
        did), not assigned to the model."""

    @abc.abstractmethod
    def assign(self, pulled):
        """Assigns a `Pulled` (from `fetch`) to the model."""


class UpdateStrategy(abc.ABC):
    """Trains minibatches against the shards in one way (synchronous rounds, asynchronous,
    ...). Implementations set `name`, the key under which `strategies.STRATEGIES` lists them.

    Args:
        replica: the `Replica` the strategy trains.
        max_stale_retries: recomputations of a minibatch refused as stale before giving up.
    """

    name: typing.ClassVar[str]

    def __init__(self, replica, max_stale_retries=20):
        self._replica = replica
        self._max_stale_retries = max_stale_retries
        self.stale_pushes = 0  # pushes some shard refused as stale, each resent

    @abc.abstractmethod
    def train(self, minibatch):
        """Computes `minibatch` and pushes it to every shard; returns its loss.

        Raises:
            PushRefused: a shard refused the minibatch for good (perhaps raised by a later
                `train` or `flush`, for a strategy that pushes in the background); it names
                the shards that never applied it.
        """

    def after_landed(self, call):
        """Runs `call()` once every push made so far has landed. Here a push has landed when
        `train` returns, so at once; a strategy that pushes in the background runs it later."""
        call()

    def flush(self):
        """Waits until every push made so far has landed. Here there is nothing to wait for.

        Raises:
            PushRefused: see `train`.
        """

    def settle(self, minibatch, shards, fresh=True):
        """Pulls, computes and pushes `minibatch` to `shards` until each has applied it,
        recomputing it for those that refuse it as stale, up to `max_stale_retries` times in
        a row; each recomputation is sent to the refusing shards alone. `fresh`: no shard
        has been sent the minibatch yet.

        Returns:
            (the loss of the last computation, {shard: the version its push was computed
            against}).

        Raises:
            PushRefused: a shard refused the push for another reason, or kept finding it
                stale, or a recomputation's loss was not finite (its cause is then the
                `NonFiniteLossError`).
            NonFiniteLossError: the loss of a fresh minibatch's first computation is not
                finite: nothing was pushed.
        """
        waiting = list(shards)  # the shards that have not applied it
        applied_at = {}
        for attempt in range(self._max_stale_retries + 1):
            self._replica.pull()
            try:
                computed = self._replica.compute(minibatch.features, minibatch.labels)
            except NonFiniteLossError as exc:
                if fresh and not attempt:
                    raise
                # Other shards applied it: these never will.
                raise PushRefused(str(exc), {i: NON_FINITE_LOSS for i in waiting}) from exc
            responses = self._replica.push(minibatch.sequence, computed, shards=waiting,
                                           then_pull=True)
            applied_at.update({i: computed.versions[i] for i in waiting if responses[i].accepted})
            refused = refusal(responses, waiting)
            if refused is not None:
                raise refused
            stale = [i for i in waiting if responses[i].stale]
            if not stale:
                return computed.loss, applied_at
            self.stale_pushes += 1
            waiting = stale
            self._replica.wait_for([responses[i].model_version if i in stale else 0
                                    for i in range(self._replica.num_ps)])
        raise PushRefused(
            f"The parameter servers rejected this worker's gradients as stale "
            f"{self._max_stale_retries + 1} times in a row: {responses[waiting[0]].reason}",
            {i: why(responses[i]) for i in waiting},
        )


def refusal(responses, shards):
    """The `PushRefused` to raise when one of `shards` refused its push for another reason
    than staleness (it names every one of them that did not apply it); else None."""
    refused = [i for i in shards if not responses[i].accepted and not responses[i].stale]
    if not refused:
        return None
    return PushRefused(
        f"A parameter server rejected the gradients: {responses[refused[0]].reason}",
        {i: why(responses[i]) for i in shards if not responses[i].accepted},
    )


def why(response):
    """A refused push's reason as the job summary groups it."""
    return "stale" if response.stale else response.reason[:200]
