"""The one place that builds gRPC channels and servers.

Every channel gets message-size limits, keepalive, a default deadline on every call and
wait-for-ready, all through gRPC's service config; calls that are safe to repeat are retried
by the config's retry policy, never by hand-written loops. Servers bind to 127.0.0.1 unless
told otherwise.

Services whose streams carry `TransferFrame`s (the parameter servers') are registered with
`add_servicer` and called through a `Stub`: both pass those frames as the bytes they are,
which `chunking` encodes and decodes without copying the tensors' bytes in and out of a
protobuf message.

Example:

    server, port = create_server([lambda s: add_MasterServicer_to_server(servicer, s)])
    channel = create_channel(f"127.0.0.1:{port}", service="elastic_keras.Master",
                             idempotent=("GetCluster", "Heartbeat"))
"""

import json
import socket
import threading
from concurrent import futures

import grpc
from google.protobuf import message_factory

from elastic_keras.common.auth import ClientAuth
from elastic_keras.common.errors import ConfigError
from elastic_keras.proto import transfer_pb2

MAX_MESSAGE_BYTES = 1 << 30
DEFAULT_DEADLINE_S = 60.0
# The threads a server serves calls with: a call that blocks (a pull waiting for a round)
# holds one, and calls beyond the pool wait for one to free up.
DEFAULT_SERVER_THREADS = 16

_COMMON_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # Servers accept the clients' keepalive pings instead of answering "too many pings".
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 10_000),
    ("grpc.http2.max_ping_strikes", 0),
]

_RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.2s",
    "maxBackoff": "3s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE"],
}


def service_config(service, idempotent=(), deadline_s=DEFAULT_DEADLINE_S):
    """The service-config JSON for a channel to `service` (e.g. "elastic_keras.Master").

    Every method gets wait-for-ready and a default deadline of `deadline_s`; the methods
    named in `idempotent` are also retried on UNAVAILABLE.
    """
    method_configs = [
        {
            "name": [{"service": service}],
            "waitForReady": True,
            "timeout": f"{deadline_s:g}s",
        }
    ]
    if idempotent:
        method_configs.insert(
            0,
            {
                "name": [{"service": service, "method": m} for m in idempotent],
                "waitForReady": True,
                "timeout": f"{deadline_s:g}s",
                "retryPolicy": _RETRY_POLICY,
            },
        )
    return json.dumps({"methodConfig": method_configs})


def create_channel(address, service, idempotent=(), deadline_s=DEFAULT_DEADLINE_S,
                   token=None, tls=None):
    """A channel to `address` configured for `service` (see `service_config`) whose calls
    carry credential `token` (see `auth`), when given, over TLS with `tls` (a
    `tls.TlsMaterial`), when given."""
    options = _COMMON_OPTIONS + [
        # A restarted peer (master, parameter server) is found again within seconds.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
        ("grpc.enable_retries", 1),
        ("grpc.service_config", service_config(service, idempotent, deadline_s)),
    ]
    if tls is not None:
        channel = grpc.secure_channel(address, tls.channel_credentials(),
                                      options=options + tls.channel_options())
    else:
        channel = grpc.insecure_channel(address, options=options)
    return grpc.intercept_channel(channel, ClientAuth(token)) if token else channel


def create_server(add_servicers, host="127.0.0.1", port=0, max_workers=DEFAULT_SERVER_THREADS,
                  auth=None, tls=None, wire_bytes=None):
    """Starts a server with every servicer that `add_servicers` (callables) registers,
    checking every call's credential with `auth` (a `ServerAuth`) when given, serving TLS
    with client certificates required with `tls` (a `tls.TlsMaterial`) when given, and
    counting the bytes of its messages in `wire_bytes` (a `WireBytes`) when given.

    Returns:
        (server, port): the started server and the port it bound, chosen by the OS when
        `port` is 0.

    Raises:
        OSError: the address cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers), options=_COMMON_OPTIONS,
        interceptors=[i for i in (auth, wire_bytes) if i] or None,
    )
    for add in add_servicers:
        add(server)
    try:
        if tls is not None:
            bound = server.add_secure_port(f"{host}:{port}", tls.server_credentials())
        else:
            bound = server.add_insecure_port(f"{host}:{port}")
    except RuntimeError:  # gRPC's answer to an address in use
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind a gRPC server to {host}:{port}")
    server.start()
    return server, bound


class WireBytes(grpc.ServerInterceptor):
    """Counts the bytes of the messages a server receives (`received`) and sends (`sent`),
    as serialized for the wire (before TLS and HTTP/2 framing). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.received = 0
        self.sent = 0

    def _add(self, received, sent):
        with self._lock:
            self.received += received
            self.sent += sent

    def intercept_service(self, continuation, details):
        handler = continuation(details)
        if handler is None:
            return None

        def deserialize(data, inner=handler.request_deserializer):
            self._add(len(data), 0)
            return inner(data) if inner else data

        def serialize(message, inner=handler.response_serializer):
            data = inner(message) if inner else message
            self._add(0, len(data))
            return data

        return handler._replace(request_deserializer=deserialize,
                                response_serializer=serialize)


WILDCARD_HOSTS = ("0.0.0.0", "::", "")


def advertised_address(host, port, advertise_host=""):
    """The `host:port` other roles reach a server at that bound `host:port`.

    `advertise_host` when given (on Kubernetes the pod's IP, from the downward API); for a
    wildcard `host` ("0.0.0.0", "::"), the address this machine's name resolves to;
    otherwise `host` itself.

    Raises:
        ConfigError: `host` is a wildcard and this machine's name does not resolve.
    """
    if not advertise_host and host in WILDCARD_HOSTS:
        try:
            advertise_host = socket.gethostbyname(socket.gethostname())
        except OSError as exc:
            raise ConfigError(
                f"--host {host!r} binds every interface, and this machine's name "
                f"({socket.gethostname()}) does not resolve to the address other roles reach "
                "it at: give it with --advertise-host. Received: no --advertise-host"
            ) from exc
    advertise_host = advertise_host or host
    if ":" in advertise_host and not advertise_host.startswith("["):
        advertise_host = f"[{advertise_host}]"  # an IPv6 address
    return f"{advertise_host}:{port}"


def wait_until_ready(channel, timeout_s):
    """Blocks until `channel` connects; raises grpc.FutureTimeoutError after `timeout_s`."""
    grpc.channel_ready_future(channel).result(timeout=timeout_s)


_HANDLERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}
_CALLS = {
    (False, False): "unary_unary", (False, True): "unary_stream",
    (True, False): "stream_unary", (True, True): "stream_stream",
}


def _message_codec(descriptor):
    """(serializer, deserializer) of a message type; none (bytes as they are) for frames."""
    if descriptor.full_name == transfer_pb2.TransferFrame.DESCRIPTOR.full_name:
        return None, None
    cls = message_factory.GetMessageClass(descriptor)
    return cls.SerializeToString, cls.FromString


def add_servicer(server, service, servicer):
    """Registers `servicer`, which has a method per RPC of `service` (a protobuf
    `ServiceDescriptor`), on `server`; `TransferFrame`s come and go as bytes."""
    handlers = {}
    for method in service.methods:
        request, response = _message_codec(method.input_type), _message_codec(method.output_type)
        handler = _HANDLERS[method.client_streaming, method.server_streaming]
        handlers[method.name] = handler(getattr(servicer, method.name),
                                        request_deserializer=request[1],
                                        response_serializer=response[0])
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),))


class Stub:
    """A client of `service` (a `ServiceDescriptor`) on `channel`: an attribute per RPC, as
    a generated stub has, except that `TransferFrame`s go and come as bytes."""

    def __init__(self, channel, service):
        for method in service.methods:
            request, response = (_message_codec(method.input_type),
                                 _message_codec(method.output_type))
            call = getattr(channel, _CALLS[method.client_streaming, method.server_streaming])
            setattr(self, method.name, call(f"/{service.full_name}/{method.name}",
                                            request_serializer=request[0],
                                            response_deserializer=response[1]))
