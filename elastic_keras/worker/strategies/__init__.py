"""The worker's update strategies, chosen by name: how computed minibatches reach the
parameter servers (see `api.UpdateStrategy`). A new strategy is a module beside these and
one entry in `STRATEGIES`."""

from elastic_keras.worker.strategies.api import (  # noqa: F401
    Computed, Minibatch, Pulled, Replica, UpdateStrategy,
)
from elastic_keras.worker.strategies.asynchronous import Asynchronous
from elastic_keras.worker.strategies.overlap import Overlapped
from elastic_keras.worker.strategies.sync import SyncRounds

STRATEGIES = {strategy.name: strategy for strategy in (SyncRounds, Asynchronous, Overlapped)}


def name_for(config):
    """The name of the strategy a worker with `WorkerConfig` `config` trains with:
    synchronous rounds when the shards wait for gradients, else asynchronous, with
    communication overlapped when the job asks for it."""
    if config.sync:
        return SyncRounds.name
    return Overlapped.name if config.overlap else Asynchronous.name


def create(name, replica, max_stale_retries=20):
    """The strategy called `name`, training `replica`.

    Raises:
        ValueError: no strategy has that name.
    """
    try:
        strategy = STRATEGIES[name]
    except KeyError:
        raise ValueError(
            f"Unknown update strategy; expected one of {sorted(STRATEGIES)}. Received: {name!r}"
        ) from None
    return strategy(replica, max_stale_retries)
