"""The raw gRPC peer: a generic bytes service on 127.0.0.1 with no protobuf, codec or
tensor work, so that a transfer's figure can be set beside gRPC's own for the same bytes.

`python -m bench.raw_grpc serve` (a `ChildServer`) serves `bench.RawBytes`, built with the
same `rpc.create_server` (message-size limits, thread pool) as the parameter servers:

- `Sink` (client stream): reads every message, answers nothing;
- `Source` (server stream): the request is int64 sizes; answers one message of each size;
- `Exchange` (unary): the request is an int64 answer size followed by any payload; answers
  that many bytes (a request/response call such as a pull of embedding rows).

`RawPeer(address)` is its client, with channels from `rpc.create_channel`.
"""

import sys

import numpy as np

from bench.common import serve_until_stdin_closes
from elastic_keras.common import rpc

SERVICE = "bench.RawBytes"
_SIZE = np.dtype("<i8")


def serve():
    """Serves `bench.RawBytes` until stdin closes (see `serve_until_stdin_closes`)."""
    import grpc

    blocks = {}

    def block(size):
        if size not in blocks:
            blocks[size] = bytes(int(size))
        return blocks[size]

    def sink(messages, context):
        for _ in messages:
            pass
        return b""

    def source(request, context):
        for size in np.frombuffer(request, _SIZE):
            yield block(size)

    def exchange(request, context):
        return block(int(np.frombuffer(request[:_SIZE.itemsize], _SIZE)[0]))

    handler = grpc.method_handlers_generic_handler(SERVICE, {
        "Sink": grpc.stream_unary_rpc_method_handler(sink),
        "Source": grpc.unary_stream_rpc_method_handler(source),
        "Exchange": grpc.unary_unary_rpc_method_handler(exchange),
    })
    serve_until_stdin_closes(
        [rpc.create_server([lambda s: s.add_generic_rpc_handlers((handler,))])])


class RawPeer:
    """The client of `serve`: moves given numbers of bytes one way, the other, or both."""

    def __init__(self, address, deadline_s=600):
        self._channel = rpc.create_channel(address, SERVICE, deadline_s=deadline_s)
        self._sink = self._channel.stream_unary(f"/{SERVICE}/Sink")
        self._source = self._channel.unary_stream(f"/{SERVICE}/Source")
        self._exchange = self._channel.unary_unary(f"/{SERVICE}/Exchange")

    def send(self, messages):
        """Streams `messages` (bytes) to the server."""
        self._sink(iter(messages))

    def receive(self, sizes):
        """Streams messages of `sizes` bytes from the server."""
        for _ in self._source(np.asarray(sizes, _SIZE).tobytes()):
            pass

    def exchange(self, request_bytes, response_bytes):
        """One unary call: `request_bytes` up, `response_bytes` down."""
        payload = bytes(max(0, request_bytes - _SIZE.itemsize))
        self._exchange(np.asarray([response_bytes], _SIZE).tobytes() + payload)

    def close(self):
        self._channel.close()


if __name__ == "__main__":
    if sys.argv[1:2] != ["serve"]:
        raise SystemExit("usage: python -m bench.raw_grpc serve")
    serve()
