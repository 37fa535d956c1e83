"""Synchronous rounds: each shard applies a round of `--grads-to-wait` pushes at once, and a
worker computes every minibatch against the version its previous one made."""

from elastic_keras.worker.strategies.api import UpdateStrategy


class SyncRounds(UpdateStrategy):
    """Pushes a minibatch, then makes the next pull wait for the rounds it joined.

    A push that a shard refuses as stale (its round closed without it) is recomputed against
    the new version and sent to that shard alone (`settle`).
    """

    name = "sync"

    def train(self, minibatch):
        loss, applied_at = self.settle(minibatch, range(self._replica.num_ps))
        self._replica.wait_for([applied_at[i] + 1 for i in range(self._replica.num_ps)])
        return loss
