"""The client side of the parameter-server shards, used by workers and the master.

Dense variables are split across shards with `partition.dense_shard`; every call goes to all
shards at once (gRPC futures) and waits for all of them.

Pushes and dense pulls go unary or streamed (see `tensor_stream`), by one rule per shard:
a payload of at most `UNARY_MAX_BYTES` (and within one chunk, `--chunk-bytes`), counted in
the transfer dtype, goes unary when the codec is "none" or "auto"; anything larger, or with
snappy or lz4 asked for, is streamed in compressed, checksummed chunks. The transfer dtype
applies to both forms. A unary payload is neither compressed nor checksummed by us (TCP's
and HTTP/2's checks only): "auto" compresses only where that pays, and it never pays on so
few bytes. A pull's size is not known before it comes: a shard's first pull is streamed,
later ones go unary while the last one was small enough. A push that carries the next pull
(`then_pull`) goes in one round trip either way: unary with the values in its answer when
both fit the rule, otherwise as a `PushPullStream` (the push's frames up, its answer and
the pull's frames down).

Why (`python -m bench.transfer`, lines `transfer/streamed_*`: codec none, float32, a PS
process on loopback, median ms streamed vs unary): a streaming call costs gRPC Python about
1-1.5 ms more than a unary one, which is all that counts for small payloads (10 KB push 4.1
vs 2.4, 0.1 MB 5.4 vs 3.9), while a unary message copies its tensors into and out of
protobuf fields and a stream's frames do not (1 MB push 5.7 vs 7.0, pull 4.6 vs 7.3; 2.1 MB
push 7.7 vs 14.7; 4 MB pull 11.8 vs 25.2).

Both forms are retried on UNAVAILABLE by the channel's policy only while gRPC still holds the
whole request (256 KiB by default); a larger push that fails in flight raises, and resending
it is safe since its (worker, sequence) makes a shard apply it at most once.
"""

import time

import numpy as np

from elastic_keras.common import partition, rpc
from elastic_keras.common.errors import PayloadError
from elastic_keras.common.ps_control import ShardControl
from elastic_keras.common.transfer import tensor_codec, tensor_stream
from elastic_keras.proto import pserver_pb2

UNARY_MAX_BYTES = 256 << 10
_UNARY_CODECS = ("none", "auto")
# A push a shard holds back while it takes a checkpoint is sent again after this pause,
# doubled for each new hold answer up to the second figure.
HELD_RETRY_S = 0.02
HELD_RETRY_MAX_S = 0.5

# InitModel keeps the first model; pulls change nothing (a pulled embedding row is created
# once, deterministically); a push carries (worker, sequence) and is applied at most once.
# A repeated PrepareCheckpoint holds again, a repeated ReleaseCheckpoint releases nothing
# more; a repeated SaveCheckpoint of a checkpoint answers what the shard wrote the first
# time (without a cut: it rewrites the file atomically).
_IDEMPOTENT = ("InitModel", "PullDense", "PullDenseStream", "PushGradients",
               "PushGradientsStream", "PushPullStream", "PullEmbedding", "PullTable",
               "PrepareCheckpoint", "SaveCheckpoint", "ReleaseCheckpoint", "LearningRate")


class PSClient(ShardControl):
    """Calls the parameter-server shards at `addresses` (indexed by shard id).

    Args:
        addresses: `host:port` of every shard, in shard order.
        deadline_s: the deadline of every call.
        transfer: the `TransferOptions` of what this client sends (gradients); what it
            pulls comes as the shards' own options say.
        token: the caller's credential (see `auth`), sent with every call.
        tls: the caller's `tls.TlsMaterial` when the job runs TLS.
    """

    def __init__(self, addresses, deadline_s=rpc.DEFAULT_DEADLINE_S,
                 transfer=tensor_stream.TransferOptions(), token=None, tls=None):
        self.addresses = list(addresses)
        self.transfer = transfer
        self._connect = lambda address: rpc.create_channel(
            address, "elastic_keras.PServer", _IDEMPOTENT, deadline_s, token, tls)
        self._channels = [self._connect(a) for a in self.addresses]
        self._stubs = [rpc.Stub(c, tensor_stream.PSERVER) for c in self._channels]
        self._retired = []  # channels of shards that moved: closed with the client
        # (shard, full precision) -> bytes of the tensors of the last pull that sent any.
        self._pull_bytes = {}
        # Per shard, the incarnation of the last pull: what pushes are computed against.
        self._incarnations = [0] * len(self._stubs)
        # Per shard, (push answer, pull answer, its tensors) of the last push's then_pull.
        self._then_pulled = {}

    @property
    def num_ps(self):
        return len(self._stubs)

    @property
    def incarnations(self):
        """Per shard, the incarnation of the last dense pull (0: none yet)."""
        return list(self._incarnations)

    def _all(self, method, requests):
        if len(self._stubs) == 1:  # a blocking call costs less than a future
            return [getattr(self._stubs[0], method)(requests[0])]
        calls = [getattr(stub, method).future(req) for stub, req in zip(self._stubs, requests)]
        return [call.result() for call in calls]

    def init_model(self, dense, optimizer_config, tables=(), options=(), worker_id=None):
        """Offers initial values `{name: array}` to their shards; returns each shard's
        `InitModelResponse` (its version, and the highest sequence of `worker_id` it applied).

        Args:
            dense: `{name: array}` of every dense variable.
            optimizer_config: JSON of `keras.optimizers.serialize(optimizer)`.
            tables: `EmbeddingTableSpec` messages; every shard holds part of every table.
            options: `VariableOptions` messages of the dense variables.

        A shard that already holds a model keeps it.
        """
        shards = partition.split_dense(dense, self.num_ps)
        requests = [
            pserver_pb2.InitModelRequest(
                dense=[tensor_codec.encode(n, v) for n, v in shard.items()],
                optimizer_config=optimizer_config,
                embedding_tables=list(tables),
                variables=[o for o in options if o.name in shard],
                worker_id=worker_id,
            )
            for shard in shards
        ]
        return self._all("InitModel", requests)

    def pull_dense(self, known_versions=None, min_versions=None, full_precision=False,
                   averaged=False):
        """Pulls the dense variables of every shard.

        Args:
            known_versions: per shard, the version the caller already holds; a shard at that
                version sends no tensors. None pulls everything.
            min_versions: per shard, wait until the shard reaches this version (synchronous
                training), up to the call's deadline.
            full_precision: ask for float32 whatever the shards' transfer dtype (an export).
            averaged: the optimizer's moving averages in place of trainable values, where it
                keeps them (`use_ema`; an export).

        Returns:
            (initialized, versions, values): whether every shard holds a model, each shard's
            version, and `{name: array}` of what was sent. Values sent as float16/bfloat16
            come back as float32; a receiver casts them to its variables' dtypes.

        Raises:
            PayloadError: a streamed answer was corrupt (nothing is returned).
        """
        known = known_versions or [-1] * self.num_ps
        least = min_versions or [0] * self.num_ps
        calls = []
        for shard, (stub, k, m) in enumerate(zip(self._stubs, known, least)):
            request = pserver_pb2.PullDenseRequest(known_version=k, min_version=m,
                                                   full_precision=full_precision,
                                                   averaged=averaged,
                                                   known_incarnation=self._incarnations[shard])
            if self._pull_unary(shard, full_precision):
                calls.append((False, stub.PullDense.future(request)))
            else:
                calls.append((True, stub.PullDenseStream(request)))
        answers = []
        for streamed, call in calls:
            if streamed:
                answers.append(tensor_stream.read_pull(call))
            else:
                response = call.result()
                answers.append((response, response.dense))
        return self._take_pulls(answers, [k == -1 for k in known], full_precision)

    def _take_pulls(self, answers, whole, full_precision=False):
        """`(initialized, versions, values)` of every shard's pull answer, `(response,
        tensors)` in shard order; notes each shard's incarnation and the size of an answer
        that holds every value (per shard in `whole`: all were asked for, or some came)."""
        values, initialized, versions = {}, True, []
        for shard, (response, tensors) in enumerate(answers):
            if response.initialized:
                self._incarnations[shard] = response.incarnation
            if response.initialized and (tensors or whole[shard]):
                self._pull_bytes[(shard, full_precision)] = tensor_stream.payload_bytes(tensors)
            values.update(tensor_stream.decode_tensors(tensors))
            initialized = initialized and response.initialized
            versions.append(response.model_version)
        return initialized, versions, values

    def pulled(self, responses):
        """What the `then_pull` of a push to every shard found, as `pull_dense` returns it,
        given that push's `responses`: once, and only for the last `push_gradients` (a
        streamed answer is held until then); None when a shard did not answer one (the push
        was not fused, or held)."""
        answers = []
        for shard, response in enumerate(responses):
            kept = self._then_pulled.pop(shard, None)
            if kept is None or kept[0] is not response:
                return None
            answers.append(kept[1:])
        return self._take_pulls(answers, [True] * len(responses))

    def _pull_unary(self, shard, full_precision):
        """Whether a dense pull from `shard` goes unary (see the module's rule)."""
        size = self._pull_bytes.get((shard, full_precision))
        return size is not None and self._fits_unary(size)

    def _split_ids(self, table, ids):
        """Per shard, the positions in `ids` of the ids that shard holds."""
        if self.num_ps == 1:
            return [np.arange(len(ids))]
        shards = partition.embedding_shards(table, ids, self.num_ps)
        return [np.flatnonzero(shards == i) for i in range(self.num_ps)]

    def pull_embeddings(self, ids_by_table, read_only=False, full_precision=False):
        """Rows of embedding tables: `{table: unique int64 ids}` -> `{table: [n, dim] rows}`.

        Rows not yet on their shard are created there with the table's initializer (once
        the table admits their ids); `read_only` (evaluation, prediction) changes nothing on
        the shards; `full_precision` asks for float32 whatever the shards' transfer dtype.
        Rows may be read-only arrays (views of the answer, when one shard holds them all).
        """
        ids_by_table = {t: np.asarray(ids, dtype=np.int64) for t, ids in ids_by_table.items()}
        positions = {t: self._split_ids(t, ids) for t, ids in ids_by_table.items()}
        requests = [
            pserver_pb2.PullEmbeddingRequest(
                ids=[tensor_codec.encode(t, ids[positions[t][i]])
                     for t, ids in ids_by_table.items() if len(positions[t][i])],
                read_only=read_only, full_precision=full_precision,
            )
            for i in range(self.num_ps)
        ]
        responses = self._all("PullEmbedding", requests)
        result = {}
        for shard, response in enumerate(responses):
            _, tensors = tensor_stream.read_embedding_frame(response)
            for table, rows in tensor_stream.decode_tensors(tensors):
                if len(positions[table][shard]) == ids_by_table[table].size == len(rows):
                    # One shard holds every id (as with one PS): its rows are in the caller's
                    # order, so they need no scatter.
                    result[table] = rows
                    continue
                if table not in result:
                    result[table] = np.empty((len(ids_by_table[table]), rows.shape[1]),
                                             rows.dtype)
                result[table][positions[table][shard]] = rows
        for table, ids in ids_by_table.items():
            if table not in result:  # no ids asked
                result[table] = np.zeros((0, 0), np.float32)
        return result

    def push_gradients(self, worker_id, sequence, versions, gradients, deltas=None,
                       embedding_grads=None, shards=None, incarnations=None, then_pull=False):
        """Pushes a minibatch's gradients to the shards, in the transfer dtype, unary or
        streamed.

        Args:
            sequence: the minibatch's sequence number (per worker, increasing).
            gradients: `{name: gradient}` of dense variables (arrays or IndexedSlices).
            deltas: `{name: array}`: what the step changed in non-trainable variables (sent
                as they are).
            embedding_grads: `{table: (unique ids, [n, dim] gradient rows)}`.
            shards: the shards to push to (default: all); the others get nothing.
            incarnations: per shard, the incarnation `versions` were pulled from (default:
                that of the last pull).
            then_pull: each shard answers, with its push, every dense value as it is once
                the push is answered, without waiting for a round (see `pulled`).

        Returns:
            The shards' `PushGradientsResponse`s in shard order, None for a shard not pushed to.
            A push a shard holds back while it takes a checkpoint is sent again, less and
            less often, until it is answered otherwise (the hold ends by itself).
        """
        shards = list(range(self.num_ps)) if shards is None else list(shards)
        incarnations = list(incarnations or self._incarnations)
        deltas = partition.split_dense(deltas or {}, self.num_ps)
        pairs = self._gradients_by_shard(gradients, embedding_grads or {})
        encoded = {i: self.transfer.encode(pairs[i]) for i in shards}
        responses = [None] * self.num_ps
        pause = HELD_RETRY_S
        while shards:
            calls = {}
            for i in shards:
                stub, tensors = self._stubs[i], encoded[i]
                header = dict(worker_id=worker_id, sequence=sequence, model_version=versions[i],
                              deltas=[tensor_codec.encode(n, v) for n, v in deltas[i].items()],
                              incarnation=incarnations[i])
                if then_pull:
                    header["then_pull"] = pserver_pb2.PullDenseRequest(
                        known_version=-1, known_incarnation=self._incarnations[i])
                calls[i] = self._push_call(i, stub, header, tensors)
            for i, call in calls.items():
                responses[i] = response = call.result()
                if isinstance(call, _PushPull) and call.pulled is not None:
                    self._then_pulled[i] = (response, *call.pulled)
                elif response.HasField("pulled"):
                    self._then_pulled[i] = (response, response.pulled, response.pulled.dense)
            shards = [i for i in shards if responses[i].held]
            if shards:
                time.sleep(pause)
                pause = min(pause * 2, HELD_RETRY_MAX_S)
        return responses

    def _gradients_by_shard(self, gradients, embedding_grads):
        """Per shard, `(name, gradient)` of the dense gradients and embedding rows it holds."""
        grads = partition.split_dense(gradients, self.num_ps)
        pairs = [list(grads[i].items()) for i in range(self.num_ps)]
        for table, (ids, rows) in embedding_grads.items():
            ids = np.asarray(ids, dtype=np.int64)
            for shard, where in enumerate(self._split_ids(table, ids)):
                if len(where):
                    pairs[shard].append((table, tensor_codec.Slices(
                        rows[where], ids[where], (0, rows.shape[1]))))
        return pairs

    def _push_call(self, shard, stub, header, tensors):
        """A push to one shard, unary or streamed (see the module's rule): its future (a
        `_PushPull` when the push carries a pull too large for a unary answer)."""
        fused = "then_pull" in header
        if self._push_unary(tensors) and (not fused or self._pull_unary(shard, False)):
            request = pserver_pb2.PushGradientsRequest(
                gradients=[tensor_codec.to_message(t) for t in tensors], **header)
            return stub.PushGradients.future(request)
        parts = tensor_stream.push_parts(pserver_pb2.PushHeader(**header), tensors,
                                         self.transfer)
        if fused:
            return _PushPull(stub.PushPullStream(parts))
        return stub.PushGradientsStream.future(parts)

    def _push_unary(self, tensors):
        """Whether a push of these wire tensors goes unary (see the module's rule)."""
        return self._fits_unary(tensor_stream.payload_bytes(tensors))

    def _fits_unary(self, size):
        return (self.transfer.compression in _UNARY_CODECS
                and size <= min(UNARY_MAX_BYTES, self.transfer.chunk_bytes))

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

    def readdress(self, addresses):
        """Calls every shard whose address in `addresses` (all shards' `host:port`, in order)
        differs from the one it is called at now, at its new address; `[]` changes nothing.

        A call already on its way to the old address fails as the shard it went to has
        (its process is gone), and is retried at the new one.

        Raises:
            ValueError: `addresses` names a different number of shards.
        """
        if not addresses:
            return
        if len(addresses) != self.num_ps:
            raise ValueError(f"addresses must name all {self.num_ps} shards. "
                             f"Received: {len(addresses)} addresses")
        for shard, address in enumerate(addresses):
            if address != self.addresses[shard]:
                channel = self._connect(address)
                self._retired.append(self._channels[shard])
                self._channels[shard], self.addresses[shard] = channel, address
                self._stubs[shard] = rpc.Stub(channel, tensor_stream.PSERVER)

    def close(self):
        for channel in self._channels + self._retired:
            channel.close()


class _PushPull:
    """A `PushPullStream` call to one shard: `result()` waits for the push's answer and the
    pull after it (`pulled`: first part and tensors, None when the push was held)."""

    def __init__(self, frames):
        self._frames = frames
        self.pulled = None

    def result(self):
        """The push's `PushGradientsResponse`.

        Raises:
            PayloadError: the answer was corrupt, or did not answer the push first.
        """
        first, tensors = tensor_stream.read_pull(self._frames)
        if not first.HasField("pushed"):
            raise PayloadError("A PushPullStream answers its push in its first part. "
                               "Received: a first part without it")
        if not first.pushed.held:
            self.pulled = (first, tensors)
        return first.pushed
