"""A `Replica` without a model or shards, for the update strategies' tests: its pushes are
answered from a script, and it records what a strategy asked of it."""

import threading

from elastic_keras.proto import pserver_pb2
from elastic_keras.worker.strategies import Computed, Pulled, Replica


def accepted(version=0):
    return pserver_pb2.PushGradientsResponse(accepted=True, model_version=version)


def stale(version):
    return pserver_pb2.PushGradientsResponse(accepted=False, stale=True, model_version=version,
                                             reason=f"stale: the shard is at {version}")


def refused(reason):
    return pserver_pb2.PushGradientsResponse(accepted=False, reason=reason)


class FakeReplica(Replica):
    """`num_ps` shards at `versions`; push `k` is answered `answers[k]` (`{shard: response}`,
    accepted where it says nothing). `events` lists, in order, ("pull", min_versions),
    ("compute", labels), ("push", sequence, shards), ("fetch",), ("assign",) and what the
    test adds."""

    def __init__(self, answers=(), versions=(3, 3)):
        self.versions = list(versions)
        self.events = []
        self.then_pulls = []  # what each push asked to pull after it
        self._answers = list(answers)
        self._min_versions = None
        self._held = None  # the versions of the values the model holds
        self._lock = threading.Lock()

    def record(self, *event):
        with self._lock:
            self.events.append(event)

    @property
    def num_ps(self):
        return len(self.versions)

    @property
    def has_values(self):
        return self._held is not None

    def pull(self):
        """Takes the shards' values, once they reach the versions `wait_for` asked."""
        self.record("pull", self._min_versions)
        least = self._min_versions or [0] * self.num_ps
        self.versions = [max(v, m) for v, m in zip(self.versions, least)]
        self._held = list(self.versions)

    def wait_for(self, min_versions):
        self._min_versions = list(min_versions)

    def compute(self, features, labels):
        self.record("compute", labels)
        return Computed(loss=float(labels), gradients={}, deltas={}, embedding_grads={},
                        versions=list(self._held), incarnations=[1] * self.num_ps)

    def push(self, sequence, computed, shards=None, then_pull=False):
        shards = list(range(self.num_ps)) if shards is None else list(shards)
        self.then_pulls.append(then_pull)
        self.record("push", sequence, shards)
        with self._lock:
            answer = self._answers.pop(0) if self._answers else {}
        return [answer.get(i, accepted(computed.versions[i])) if i in shards else None
                for i in range(self.num_ps)]

    def fetch(self):
        self.record("fetch")
        return Pulled(True, list(self.versions), {}, [1] * self.num_ps)

    def assign(self, pulled):
        self.record("assign")
        self._held = list(pulled.versions)
