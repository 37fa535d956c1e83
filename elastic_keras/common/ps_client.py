"""The client side of the parameter-server shards, used by workers and the master.

Dense variables are split across shards with `partition.dense_shard`; every call goes to all
shards at once (gRPC futures) and waits for all of them.
"""

import numpy as np

from elastic_keras.common import partition, rpc, tensor_codec
from elastic_keras.proto import pserver_pb2, pserver_pb2_grpc

# InitModel keeps the first model; pulls change nothing; a push carries (worker, sequence)
# and is applied at most once, so a retried one is harmless.
_IDEMPOTENT = ("InitModel", "PullDense", "PushGradients")


class PSClient:
    """Calls the parameter-server shards at `addresses` (indexed by shard id)."""

    def __init__(self, addresses, deadline_s=rpc.DEFAULT_DEADLINE_S):
        self.addresses = list(addresses)
        self._channels = [
            rpc.create_channel(a, "elastic_keras.PServer", _IDEMPOTENT, deadline_s)
            for a in self.addresses
        ]
        self._stubs = [pserver_pb2_grpc.PServerStub(c) for c in self._channels]

    @property
    def num_ps(self):
        return len(self._stubs)

    def _all(self, method, requests):
        calls = [getattr(stub, method).future(req) for stub, req in zip(self._stubs, requests)]
        return [call.result() for call in calls]

    def init_model(self, dense, optimizer_config):
        """Offers initial values `{name: array}` to their shards; returns each shard's version.

        A shard that already holds a model keeps it.
        """
        shards = partition.split_dense(dense, self.num_ps)
        requests = [
            pserver_pb2.InitModelRequest(
                dense=[tensor_codec.encode(n, v) for n, v in shard.items()],
                optimizer_config=optimizer_config,
            )
            for shard in shards
        ]
        return [r.model_version for r in self._all("InitModel", requests)]

    def pull_dense(self, known_versions=None):
        """Pulls the dense variables of every shard.

        Args:
            known_versions: per shard, the version the caller already holds; a shard at that
                version sends no tensors. None pulls everything.

        Returns:
            (initialized, versions, values): whether every shard holds a model, each shard's
            version, and `{name: array}` of what was sent.
        """
        known = known_versions or [-1] * self.num_ps
        responses = self._all(
            "PullDense", [pserver_pb2.PullDenseRequest(known_version=k) for k in known]
        )
        values = {}
        for response in responses:
            for tensor in response.dense:
                values[tensor.name] = tensor_codec.decode(tensor)
        initialized = all(r.initialized for r in responses)
        return initialized, [r.model_version for r in responses], values

    def push_gradients(self, worker_id, sequence, versions, gradients, assign=None):
        """Pushes `{name: gradient}` (arrays or IndexedSlices) and `assign` `{name: value}`.

        Returns:
            The shards' `PushGradientsResponse`s, in shard order.
        """
        grads = partition.split_dense(gradients, self.num_ps)
        assigns = partition.split_dense(assign or {}, self.num_ps)
        requests = [
            pserver_pb2.PushGradientsRequest(
                worker_id=worker_id,
                sequence=sequence,
                model_version=versions[i],
                gradients=[tensor_codec.encode(n, g) for n, g in grads[i].items()],
                assign=[tensor_codec.encode(n, np.asarray(v)) for n, v in assigns[i].items()],
            )
            for i in range(self.num_ps)
        ]
        return self._all("PushGradients", requests)

    def close(self):
        for channel in self._channels:
            channel.close()
