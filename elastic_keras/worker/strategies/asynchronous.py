"""Asynchronous updates: each shard applies a push at once; a worker pulls, computes and
pushes one minibatch after another."""

from elastic_keras.worker.strategies.api import UpdateStrategy


class Asynchronous(UpdateStrategy):
    """Pulls, computes and pushes each minibatch in turn, waiting for nothing else.

    A push that a shard refuses as stale (staler than `--max-staleness`, or the shard
    restarted) is recomputed against fresh values and sent to that shard alone (`settle`).
    """

    name = "async"

    def train(self, minibatch):
        loss, _ = self.settle(minibatch, range(self._replica.num_ps))
        return loss
