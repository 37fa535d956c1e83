"""The PServer gRPC service: translates messages to `Parameters` calls and errors to statuses.

`PayloadError` becomes INVALID_ARGUMENT and `NotReadyError` FAILED_PRECONDITION; in both
cases the shard is unchanged. Tensors are decoded here, outside the shard's lock.

Example:

    server, port = rpc.create_server(
        [lambda s: pserver_pb2_grpc.add_PServerServicer_to_server(
            PServerServicer(Parameters()), s)])
"""

import contextlib
import logging

import grpc

from elastic_keras.common import tensor_codec
from elastic_keras.common.errors import NotReadyError, PayloadError
from elastic_keras.proto import pserver_pb2, pserver_pb2_grpc
from elastic_keras.ps.parameters import Push, TableConfig

logger = logging.getLogger(__name__)

# The longest a pull waits for a synchronous round (the caller then asks again).
MAX_ROUND_WAIT_S = 50.0


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


def _decode_all(tensors):
    return tuple((tensor.name, tensor_codec.decode(tensor)) for tensor in tensors)


class PServerServicer(pserver_pb2_grpc.PServerServicer):
    """Serves one shard's `Parameters` over gRPC."""

    def __init__(self, parameters):
        self._parameters = parameters

    def InitModel(self, request, context):
        with _abort_on_domain_errors(context, "InitModel"):
            result = self._parameters.init_model(
                _decode_all(request.dense), request.optimizer_config,
                [TableConfig(t.name, t.dim, t.input_dim, t.initializer or "uniform",
                             t.dtype or "float32") for t in request.embedding_tables],
            )
        return pserver_pb2.InitModelResponse(
            initialized_now=result.initialized_now, model_version=result.model_version
        )

    def PullDense(self, request, context):
        # A synchronous worker waits for its round; leave a margin of its deadline to answer.
        remaining = context.time_remaining()
        wait_s = max(0.0, min(MAX_ROUND_WAIT_S, (remaining or MAX_ROUND_WAIT_S) - 1.0))
        result = self._parameters.pull(request.known_version, request.min_version, wait_s)
        return pserver_pb2.PullDenseResponse(
            initialized=result.initialized,
            model_version=result.model_version,
            dense=[tensor_codec.encode(name, value) for name, value in result.dense.items()],
        )

    def PushGradients(self, request, context):
        with _abort_on_domain_errors(context, f"PushGradients from worker {request.worker_id}"):
            result = self._parameters.push(
                Push(
                    worker_id=request.worker_id,
                    sequence=request.sequence,
                    model_version=request.model_version,
                    gradients=_decode_all(request.gradients),
                    assign=_decode_all(request.assign),
                )
            )
        return pserver_pb2.PushGradientsResponse(
            accepted=result.accepted, model_version=result.model_version, reason=result.reason,
            stale=result.stale,
        )

    def PullEmbedding(self, request, context):
        with _abort_on_domain_errors(context, "PullEmbedding"):
            rows, version = self._parameters.pull_embeddings(_decode_all(request.ids))
        return pserver_pb2.PullEmbeddingResponse(
            rows=[tensor_codec.encode(name, value) for name, value in rows.items()],
            model_version=version,
        )

    def PullTable(self, request, context):
        with _abort_on_domain_errors(context, "PullTable"):
            chunks = self._parameters.table_rows(request.table, request.rows_per_chunk or 65536)
        for ids, rows in chunks:
            yield pserver_pb2.PullTableResponse(
                rows=tensor_codec.encode_slices(request.table, rows, ids, (0, rows.shape[1]))
            )
