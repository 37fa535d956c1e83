"""The PServer gRPC service: translates messages to `Parameters` calls and errors to statuses.

`PayloadError` becomes INVALID_ARGUMENT and `NotReadyError` FAILED_PRECONDITION; in both
cases the shard is unchanged. Tensors are decoded here, outside the shard's lock. Pushes and
dense pulls come unary or streamed (`tensor_stream`); a streamed push is read whole, every
chunk checked, before anything reaches `Parameters`. Gradients that arrive as float16 or
bfloat16 become float32 first; pulled parameters and embedding rows leave in the shard's
transfer dtype (`TransferOptions`), and streamed pulls in its codec and chunk size.
SaveCheckpoint names a checkpoint by number; the shard writes its file into
`CHECKPOINT_DIR/ckpt-N` of its own `--checkpoint-dir` (`ps/checkpoint.py`) and nowhere else.
A bad request is INVALID_ARGUMENT, a shard without a model or a checkpoint directory
FAILED_PRECONDITION and a failed write INTERNAL, each naming the path.

Every request is checked before anything changes (see `Parameters` and `updates`), against
the shard's `PayloadLimits` too: a streamed push is counted as it arrives and refused once
it passes `--max-push-bytes`, before the rest is read or allocated. A push that TensorFlow
fails to apply (`ApplyError`) is INTERNAL. A pull that waits for a synchronous round holds
a server thread for up to `MAX_ROUND_WAIT_S`: at most `max_waiting_pulls` wait at once, and
one more is answered at once with the current version, as a pull without a wait would be,
so pushes and other pulls always find a thread (the shard's pool has `SERVER_THREADS`).

Register it with `add_to_server`, which passes the streamed RPCs' `TransferFrame`s as bytes.

Example:

    server, port = rpc.create_server([lambda s: add_to_server(PServerServicer(Parameters()), s)])
"""

import contextlib
import logging
import os
import threading

import grpc

from elastic_keras.common import auth, checkpoint_layout, rpc
from elastic_keras.common.transfer import tensor_codec, tensor_stream
from elastic_keras.common.errors import (
    ApplyError, NotReadyError, PayloadError, ReplacedLaunchError,
)
from elastic_keras.proto import pserver_pb2, pserver_pb2_grpc
from elastic_keras.ps.checkpoint import save_shard
from elastic_keras.ps.shard_types import Push, TableConfig, VariableOptions

logger = logging.getLogger(__name__)

# The longest a pull waits for a synchronous round (the caller then asks again).
MAX_ROUND_WAIT_S = 50.0
# Above any sequence a worker makes (it starts at the clock in ns, 2**62 ns after 1970 is
# in 2116): far from int64's end, so no sequence overflows.
MAX_SEQUENCE = 1 << 62
# The longest a checkpoint may hold pushes back (PrepareCheckpoint.hold_s).
MAX_HOLD_S = 120.0
# A shard's server threads (see `ps/main`), and how many of them pulls waiting for a round
# may hold at once (a servicer on a server of `rpc`'s default pool waits with fewer).
SERVER_THREADS = 4 * rpc.DEFAULT_SERVER_THREADS
WAITING_PULLS = SERVER_THREADS - rpc.DEFAULT_SERVER_THREADS


# Who may call what (see `auth.ServerAuth`): workers train, the master checkpoints and
# exports (reading values and rows); nobody else calls a shard.
AUTHORITY = {
    "InitModel": {auth.Role.WORKER},
    "PullDense": {auth.Role.WORKER, auth.Role.MASTER},
    "PullDenseStream": {auth.Role.WORKER, auth.Role.MASTER},
    "PushGradients": {auth.Role.WORKER},
    "PushGradientsStream": {auth.Role.WORKER},
    "PushPullStream": {auth.Role.WORKER},
    "PullEmbedding": {auth.Role.WORKER, auth.Role.MASTER},
    "PullTable": {auth.Role.MASTER},
    "PrepareCheckpoint": {auth.Role.MASTER},
    "SaveCheckpoint": {auth.Role.MASTER},
    "ReleaseCheckpoint": {auth.Role.MASTER},
    "LearningRate": {auth.Role.MASTER},
}


def bind_worker(context, worker_id):
    """Aborts the call with PERMISSION_DENIED unless its caller is worker `worker_id` (a
    server without `auth.ServerAuth`, in tests, binds nothing)."""
    caller = auth.caller(context)
    if caller is not None and caller.index != worker_id:
        context.abort(grpc.StatusCode.PERMISSION_DENIED,
                      f"{caller.name} may not act as worker {worker_id}")


def _launch(context):
    """The launch of the worker calling (None: not known, on a server without auth)."""
    caller = auth.caller(context)
    return caller.incarnation if caller is not None else None


def add_to_server(servicer, server):
    """Serves `servicer` on `server`, its streams' frames as bytes (see `rpc.add_servicer`)."""
    rpc.add_servicer(server, tensor_stream.PSERVER, servicer)


@contextlib.contextmanager
def _abort_on_domain_errors(context, method):
    try:
        yield
    except PayloadError as exc:
        logger.warning("%s rejected: %s", method, exc)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except NotReadyError as exc:
        logger.info("%s refused: %s", method, exc)
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except ApplyError as exc:
        logger.error("%s failed: %s", method, exc, exc_info=exc.__cause__)
        context.abort(grpc.StatusCode.INTERNAL, f"{method}: {exc}")
    except ReplacedLaunchError as exc:
        logger.warning("%s refused: %s", method, exc)
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))


def _table_config(spec):
    """The `TableConfig` of an `EmbeddingTableSpec` (its unset lifecycle fields: None)."""
    return TableConfig(
        spec.name, spec.dim, spec.input_dim, spec.initializer or "uniform",
        spec.dtype or "float32",
        *(getattr(spec, f) if spec.HasField(f) else None
          for f in ("admit_after", "admit_probability", "idle_steps", "max_rows",
                    "idle_seconds")),
    )


def _decode_all(tensors):
    return tuple((tensor.name, tensor_codec.decode(tensor)) for tensor in tensors)


class PServerServicer(pserver_pb2_grpc.PServerServicer):
    """Serves one shard's `Parameters` over gRPC, sending tensors as `transfer` says.

    `ps_id` of `num_ps` is the shard's place in the job, which names its checkpoint files;
    it writes them into `checkpoint_dir` (absolute; empty: this shard takes no checkpoints)
    and nowhere else. At most `max_waiting_pulls` pulls wait for a round at once: keep it
    below the server's threads.
    """

    def __init__(self, parameters, transfer=tensor_stream.TransferOptions(), ps_id=0,
                 num_ps=1, checkpoint_dir="", max_waiting_pulls=rpc.DEFAULT_SERVER_THREADS // 2):
        self._parameters = parameters
        self._max_waiting_pulls = max_waiting_pulls
        self._waiting_pulls = threading.BoundedSemaphore(max_waiting_pulls)
        self._transfer = transfer
        self._ps_id = ps_id
        self._num_ps = num_ps
        self._checkpoint_dir = checkpoint_dir
        self._first_push_accepted = False
        self._last_save = (None, None)  # (request, response) of the last SaveCheckpoint
        self._warned_tables = set()  # tables whose kept policy was logged

    def InitModel(self, request, context):
        if request.HasField("worker_id"):
            bind_worker(context, request.worker_id)
        tables = [_table_config(t) for t in request.embedding_tables]
        with _abort_on_domain_errors(context, "InitModel"):
            result = self._parameters.init_model(
                _decode_all(request.dense), request.optimizer_config, tables,
                [VariableOptions(v.name, v.trainable, v.constraint, v.exclude_from_weight_decay)
                 for v in request.variables],
            )
        if result.initialized_now:
            for table in tables:
                logger.info("Table %s (dim %d): %s", table.name, table.dim,
                            self._parameters.lifecycle.of_table(table).describe())
        else:
            self._warn_of_kept_lifecycles(tables)
        return pserver_pb2.InitModelResponse(
            initialized_now=result.initialized_now, model_version=result.model_version,
            applied_sequence=(self._parameters.applied_sequence(request.worker_id,
                                                                _launch(context))
                              if request.HasField("worker_id") else 0),
        )

    def _warn_of_kept_lifecycles(self, tables):
        """Logs, once a table, where InitModel asks a held table (restored from a checkpoint)
        for another admission or eviction policy than it keeps."""
        held = self._parameters.table_lifecycles
        for table in tables:
            asked = self._parameters.lifecycle.of_table(table)
            kept = held.get(table.name)
            if kept is not None and kept != asked and table.name not in self._warned_tables:
                self._warned_tables.add(table.name)
                logger.warning("Table %s keeps the policy it was restored with (%s), not the "
                               "one now asked for (%s): a table's policy is set when it is "
                               "first created", table.name, kept.describe(), asked.describe())

    def _pull(self, request, context):
        """(PullResult, its tensors encoded for the wire)."""
        # A synchronous worker waits for its round; leave a margin of its deadline to answer.
        remaining = context.time_remaining()
        wait_s = max(0.0, min(MAX_ROUND_WAIT_S, (remaining or MAX_ROUND_WAIT_S) - 1.0))
        waits = wait_s > 0 and request.min_version > self._parameters.version
        if waits and not self._waiting_pulls.acquire(blocking=False):
            waits = False
            logger.warning("%d pulls wait for a round already: one for version %d is answered "
                           "at once.", self._max_waiting_pulls, request.min_version)
        try:
            result = self._parameters.pull(request.known_version, request.min_version,
                                           wait_s if waits else 0.0, request.averaged,
                                           request.known_incarnation)
        finally:
            if waits:
                self._waiting_pulls.release()
        return result, self._transfer.encode(result.dense.items(), request.full_precision)

    def PullDense(self, request, context):
        return self._pull_response(request, context)

    def _pull_response(self, request, context):
        result, tensors = self._pull(request, context)
        return pserver_pb2.PullDenseResponse(
            initialized=result.initialized, model_version=result.model_version,
            dense=[tensor_codec.to_message(tensor) for tensor in tensors],
            incarnation=result.incarnation,
        )

    def PullDenseStream(self, request, context):
        result, tensors = self._pull(request, context)
        yield from tensor_stream.pull_parts(result.initialized, result.model_version, tensors,
                                            self._transfer, result.incarnation)

    def _push(self, header, gradients, context, method):
        bind_worker(context, header.worker_id)
        if not 0 <= header.sequence < MAX_SEQUENCE:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"{method}: sequence must be in [0, 2**62). "
                          f"Received: sequence={header.sequence}")
        held = self._parameters.held(header.worker_id, header.sequence)
        if held is not None:  # answered before the gradients are decoded
            return pserver_pb2.PushGradientsResponse(
                accepted=False, model_version=held.model_version, reason=held.reason,
                held=True)
        with _abort_on_domain_errors(context, f"{method} from worker {header.worker_id}"):
            result = self._parameters.push(
                Push(
                    worker_id=header.worker_id,
                    sequence=header.sequence,
                    model_version=header.model_version,
                    gradients=tensor_stream.decode_tensors(gradients),
                    deltas=_decode_all(header.deltas),
                    incarnation=header.incarnation,
                    launch=_launch(context),
                )
            )
        if result.accepted and not self._first_push_accepted:
            self._first_push_accepted = True  # when training reaches this process: a log line
            logger.info("Shard %d accepted its first push (from worker %d): model version %d.",
                        self._ps_id, header.worker_id, result.model_version)
        response = pserver_pb2.PushGradientsResponse(
            accepted=result.accepted, model_version=result.model_version, reason=result.reason,
            stale=result.stale, held=result.held,
        )
        if header.HasField("then_pull") and not result.held:
            response.pulled.CopyFrom(self._pull_response(header.then_pull, context))
        return response

    def PushGradients(self, request, context):
        limit = self._parameters.limits.max_push_bytes
        with _abort_on_domain_errors(context, "PushGradients"):
            size = tensor_stream.payload_bytes([*request.gradients, *request.deltas])
            if size > limit:
                raise PayloadError(f"PushGradients may carry at most {limit} bytes of tensors "
                                   f"(--max-push-bytes). Received: {size} bytes")
        return self._push(request, request.gradients, context, "PushGradients")

    def PushGradientsStream(self, request_iterator, context):
        with _abort_on_domain_errors(context, "PushGradientsStream"):
            header, gradients = tensor_stream.read_push(
                request_iterator, self._parameters.limits.max_push_bytes)
        return self._push(header, gradients, context, "PushGradientsStream")

    def PushPullStream(self, request_iterator, context):
        with _abort_on_domain_errors(context, "PushPullStream"):
            header, gradients = tensor_stream.read_push(
                request_iterator, self._parameters.limits.max_push_bytes)
        if not header.HasField("then_pull"):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "PushPullStream: the push's header must ask then_pull. "
                          "Received: a header without it")
        pull = pserver_pb2.PullDenseRequest()
        pull.CopyFrom(header.then_pull)
        header.ClearField("then_pull")  # pulled below, streamed
        pushed = self._push(header, gradients, context, "PushPullStream")
        if pushed.held:
            yield from tensor_stream.pull_parts(False, pushed.model_version, [],
                                                self._transfer, pushed=pushed)
            return
        result, tensors = self._pull(pull, context)
        yield from tensor_stream.pull_parts(result.initialized, result.model_version, tensors,
                                            self._transfer, result.incarnation, pushed)

    def PullEmbedding(self, request, context):
        with _abort_on_domain_errors(context, "PullEmbedding"):
            rows, version = self._parameters.pull_embeddings(_decode_all(request.ids),
                                                             read_only=request.read_only)
        return tensor_stream.embedding_frame(
            version, self._transfer.encode(rows.items(), request.full_precision), self._transfer)

    def PullTable(self, request, context):
        with _abort_on_domain_errors(context, "PullTable"):
            chunks = self._parameters.table_rows(request.table, request.rows_per_chunk or 65536)
        for ids, rows in chunks:
            yield pserver_pb2.PullTableResponse(
                rows=tensor_codec.encode_slices(request.table, rows, ids, (0, rows.shape[1]))
            )

    def PrepareCheckpoint(self, request, context):
        if not 0 < request.hold_s <= MAX_HOLD_S:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"PrepareCheckpoint: hold_s must be in (0, {MAX_HOLD_S}]. "
                          f"Received: hold_s={request.hold_s}")
        with _abort_on_domain_errors(context, "PrepareCheckpoint"):
            applied, version = self._parameters.prepare_checkpoint(request.checkpoint_id,
                                                                   request.hold_s)
        return pserver_pb2.PrepareCheckpointResponse(applied_sequences=applied,
                                                     model_version=version)

    def ReleaseCheckpoint(self, request, context):
        self._parameters.release_checkpoint(request.checkpoint_id)
        return pserver_pb2.ReleaseCheckpointResponse()

    def LearningRate(self, request, context):
        with _abort_on_domain_errors(context, "LearningRate"):
            if request.HasField("learning_rate"):
                self._parameters.set_learning_rate(request.learning_rate)
                logger.info("Learning rate set to %g", request.learning_rate)
        rate = self._parameters.learning_rate
        initialized = self._parameters.initialized
        return pserver_pb2.LearningRateResponse(
            initialized=initialized, schedule=initialized and rate is None,
            **({} if rate is None else {"learning_rate": rate}))

    def SaveCheckpoint(self, request, context):
        last_request, last_response = self._last_save
        if request == last_request:
            return last_response  # a retry of a save that is done: the file is written
        path = self._checkpoint_path(request, context)
        with _abort_on_domain_errors(context, "SaveCheckpoint"):
            try:
                shard = save_shard(self._parameters, path, self._ps_id, self._num_ps,
                                   0 if request.without_cut else request.checkpoint_id,
                                   dict(request.cut))
            except OSError as exc:
                logger.error("SaveCheckpoint into %s failed: %s", path, exc)
                context.abort(
                    grpc.StatusCode.INTERNAL,
                    f"SaveCheckpoint: shard {self._ps_id} cannot write its file into {path}: "
                    f"{exc}",
                )
        logger.info("Saved shard %d of %d at version %d to %s (%d bytes).", self._ps_id,
                    self._num_ps, shard.model_version, os.path.join(path, shard.file),
                    shard.bytes)
        response = pserver_pb2.SaveCheckpointResponse(
            file=shard.file, bytes=shard.bytes, crc32c=shard.crc32c,
            model_version=shard.model_version,
        )
        self._last_save = (request, response)
        return response

    def _checkpoint_path(self, request, context):
        """The directory SaveCheckpoint `request` names, CHECKPOINT_DIR/ckpt-N; aborts the
        call when it names none this shard may write."""
        if not self._checkpoint_dir:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"SaveCheckpoint: shard {self._ps_id} was started without "
                          "--checkpoint-dir, so it writes no checkpoints")
        if request.num_ps != self._num_ps:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          f"SaveCheckpoint: num_ps must be the job's {self._num_ps}. "
                          f"Received: num_ps={request.num_ps}")
        if request.checkpoint_id < 1:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                          "SaveCheckpoint: checkpoint_id must be a checkpoint number, 1 or "
                          f"more. Received: checkpoint_id={request.checkpoint_id}")
        return checkpoint_layout.checkpoint_path(self._checkpoint_dir, request.checkpoint_id)
