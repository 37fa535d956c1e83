"""The client side of the parameter-server shards, used by workers and the master.

Dense variables are split across shards with `partition.dense_shard`; every call goes to all
shards at once (gRPC futures) and waits for all of them.
"""

import numpy as np

from elastic_keras.common import partition, rpc, tensor_codec
from elastic_keras.proto import pserver_pb2, pserver_pb2_grpc

# InitModel keeps the first model; pulls change nothing (a pulled embedding row is created
# once, deterministically); a push carries (worker, sequence) and is applied at most once.
_IDEMPOTENT = ("InitModel", "PullDense", "PushGradients", "PullEmbedding", "PullTable")


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

    def init_model(self, dense, optimizer_config, tables=()):
        """Offers initial values `{name: array}` to their shards; returns each shard's version.

        Args:
            dense: `{name: array}` of every dense variable.
            optimizer_config: JSON of `keras.optimizers.serialize(optimizer)`.
            tables: `EmbeddingTableSpec` messages; every shard holds part of every table.

        A shard that already holds a model keeps it.
        """
        shards = partition.split_dense(dense, self.num_ps)
        requests = [
            pserver_pb2.InitModelRequest(
                dense=[tensor_codec.encode(n, v) for n, v in shard.items()],
                optimizer_config=optimizer_config,
                embedding_tables=list(tables),
            )
            for shard in shards
        ]
        return [r.model_version for r in self._all("InitModel", requests)]

    def pull_dense(self, known_versions=None, min_versions=None):
        """Pulls the dense variables of every shard.

        Args:
            known_versions: per shard, the version the caller already holds; a shard at that
                version sends no tensors. None pulls everything.
            min_versions: per shard, wait until the shard reaches this version (synchronous
                training), up to the call's deadline.

        Returns:
            (initialized, versions, values): whether every shard holds a model, each shard's
            version, and `{name: array}` of what was sent.
        """
        known = known_versions or [-1] * self.num_ps
        least = min_versions or [0] * self.num_ps
        responses = self._all("PullDense", [
            pserver_pb2.PullDenseRequest(known_version=k, min_version=m)
            for k, m in zip(known, least)
        ])
        values = {}
        for response in responses:
            for tensor in response.dense:
                values[tensor.name] = tensor_codec.decode(tensor)
        initialized = all(r.initialized for r in responses)
        return initialized, [r.model_version for r in responses], values

    def _split_ids(self, table, ids):
        """Per shard, the positions in `ids` of the ids that shard holds."""
        shards = partition.embedding_shards(table, ids, self.num_ps)
        return [np.flatnonzero(shards == i) for i in range(self.num_ps)]

    def pull_embeddings(self, ids_by_table):
        """Rows of embedding tables: `{table: unique int64 ids}` -> `{table: [n, dim] rows}`.

        Rows not yet on their shard are created there with the table's initializer.
        """
        ids_by_table = {t: np.asarray(ids, dtype=np.int64) for t, ids in ids_by_table.items()}
        positions = {t: self._split_ids(t, ids) for t, ids in ids_by_table.items()}
        requests = [
            pserver_pb2.PullEmbeddingRequest(
                ids=[tensor_codec.encode(t, ids[positions[t][i]])
                     for t, ids in ids_by_table.items() if len(positions[t][i])]
            )
            for i in range(self.num_ps)
        ]
        responses = self._all("PullEmbedding", requests)
        result = {}
        for shard, response in enumerate(responses):
            for tensor in response.rows:
                rows = tensor_codec.decode(tensor)
                table = tensor.name
                if table not in result:
                    result[table] = np.empty((len(ids_by_table[table]), rows.shape[1]),
                                             rows.dtype)
                result[table][positions[table][shard]] = rows
        for table, ids in ids_by_table.items():
            if table not in result:  # no ids asked
                result[table] = np.zeros((0, 0), np.float32)
        return result

    def push_gradients(self, worker_id, sequence, versions, gradients, assign=None,
                       embedding_grads=None):
        """Pushes gradients to every shard.

        Args:
            gradients: `{name: gradient}` of dense variables (arrays or IndexedSlices).
            assign: `{name: value}` of non-trainable variables.
            embedding_grads: `{table: (unique ids, [n, dim] gradient rows)}`.

        Returns:
            The shards' `PushGradientsResponse`s, in shard order.
        """
        grads = partition.split_dense(gradients, self.num_ps)
        assigns = partition.split_dense(assign or {}, self.num_ps)
        tensors = [[tensor_codec.encode(n, g) for n, g in grads[i].items()]
                   for i in range(self.num_ps)]
        for table, (ids, rows) in (embedding_grads or {}).items():
            ids = np.asarray(ids, dtype=np.int64)
            for shard, where in enumerate(self._split_ids(table, ids)):
                if len(where):
                    tensors[shard].append(tensor_codec.encode_slices(
                        table, rows[where], ids[where], (0, rows.shape[1])))
        requests = [
            pserver_pb2.PushGradientsRequest(
                worker_id=worker_id,
                sequence=sequence,
                model_version=versions[i],
                gradients=tensors[i],
                assign=[tensor_codec.encode(n, v) for n, v in assigns[i].items()],
            )
            for i in range(self.num_ps)
        ]
        return self._all("PushGradients", requests)

    def pull_table(self, table, rows_per_chunk=0):
        """Every row of `table` that any shard holds: (ids, rows), in no particular order."""
        ids, rows = [], []
        for stub in self._stubs:
            request = pserver_pb2.PullTableRequest(table=table, rows_per_chunk=rows_per_chunk)
            for response in stub.PullTable(request):
                chunk = tensor_codec.decode(response.rows)
                ids.append(np.array(chunk.ids))
                rows.append(np.array(chunk.values))
        if not ids:
            return np.zeros(0, np.int64), None
        return np.concatenate(ids), np.concatenate(rows)

    def close(self):
        for channel in self._channels:
            channel.close()
