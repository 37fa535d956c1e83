"""Who is calling: a credential on every call, checked before any servicer code runs.

Each job has a secret the master makes at launch (`new_secret`). A caller's credential is
its identity (role, index, incarnation) with an HMAC-SHA256 of it, and of the job's name,
under that secret; it travels in each call's metadata (`ClientAuth`). A server checks it in
an interceptor (`ServerAuth`): a call without a valid credential ends UNAUTHENTICATED, one
from a role the method is not for PERMISSION_DENIED, and in both cases no request byte is
parsed and nothing is touched. Servicers read the checked caller with `caller(context)` to
bind request fields (a worker pushes and reports only as itself).

Who holds what: the master holds the secret; a parameter server gets it too, in a file only
its user can read, because it checks the workers' credentials; a worker gets only its own
credential, and `elastic-keras scale` a client credential kept in the job locator's
owner-only file. Neither appears on a command line.

Example:

    >>> secret = new_secret()
    >>> token = credential(secret, "job", Identity(Role.WORKER, 3, 1))
    >>> Verifier(secret, "job").identity(token)
    Identity(role=<Role.WORKER: 'worker'>, index=3, incarnation=1)
    >>> Verifier(new_secret(), "job").identity(token) is None
    True
"""

import collections
import dataclasses
import enum
import hashlib
import hmac
import logging
import secrets
import threading

import grpc

from elastic_keras.common.errors import ConfigError

logger = logging.getLogger(__name__)

METADATA_KEY = "ek-credential"
SECRET_BYTES = 32
_CACHE_SIZE = 4096  # checked credentials remembered, so a call costs one dict lookup


class Role(str, enum.Enum):
    MASTER = "master"
    PS = "ps"
    WORKER = "worker"
    CLIENT = "client"  # `elastic-keras scale` and other commands run by the job's user


@dataclasses.dataclass(frozen=True)
class Identity:
    """A caller: role `role` number `index`, in its `incarnation`-th launch (0 first)."""

    role: Role
    index: int = 0
    incarnation: int = 0

    @property
    def name(self):
        return f"{self.role.value}-{self.index}"

    def encode(self):
        return f"{self.role.value}/{self.index}/{self.incarnation}"


def new_secret():
    """A fresh job secret."""
    return secrets.token_bytes(SECRET_BYTES)


def credential(secret, job_name, identity):
    """The credential of `identity` in job `job_name`: its identity and their HMAC."""
    text = identity.encode()
    return f"{text}/{_mac(secret, job_name, text)}"


def _mac(secret, job_name, text):
    return hmac.new(secret, f"{job_name}\0{text}".encode(), hashlib.sha256).hexdigest()


def _parse(token):
    """The `Identity` a credential names (not checked), or None for a malformed one."""
    parts = token.split("/") if isinstance(token, str) else []
    if len(parts) != 4:
        return None
    role, index, incarnation, _ = parts
    try:
        identity = Identity(Role(role), int(index), int(incarnation))
    except ValueError:
        return None
    if identity.index < 0 or identity.incarnation < 0 or identity.encode() != "/".join(parts[:3]):
        return None  # one spelling per identity: "007" or "+7" is not worker 7
    return identity


class Verifier:
    """Checks credentials of job `job_name` against its `secret`."""

    def __init__(self, secret, job_name):
        self._secret, self._job_name = secret, job_name
        self._checked = collections.OrderedDict()  # credential -> Identity
        self._lock = threading.Lock()

    def identity(self, token):
        """The caller `token` proves to be, or None."""
        with self._lock:
            found = self._checked.get(token)
        if found is not None:
            return found
        identity = _parse(token)
        if identity is None:
            return None
        text, _, mac = token.rpartition("/")
        if not hmac.compare_digest(mac, _mac(self._secret, self._job_name, text)):
            return None
        with self._lock:
            self._checked[token] = identity
            while len(self._checked) > _CACHE_SIZE:
                self._checked.popitem(last=False)
        return identity


def caller(context):
    """The checked caller of the current call, or None on a server without `ServerAuth`."""
    for key, value in context.invocation_metadata() or ():
        if key == METADATA_KEY:
            return _parse(value)
    return None




# -- interceptors -----------------------------------------------------------------------


class ClientAuth(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                 grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds credential `token` to every call of the channel it intercepts."""

    def __init__(self, token):
        self._metadata = ((METADATA_KEY, token),)

    def _details(self, details):
        return details._replace(metadata=tuple(details.metadata or ()) + self._metadata)

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, requests):
        return continuation(self._details(details), requests)

    def intercept_stream_stream(self, continuation, details, requests):
        return continuation(self._details(details), requests)


class ServerAuth(grpc.ServerInterceptor):
    """Refuses calls without a valid credential, and calls from roles a method is not for.

    Args:
        verifier: the job's `Verifier`.
        authority: `{method name: roles allowed}` for every method of the server's services,
            by short name ("PushGradients"); a method not named is refused to everyone.
    """

    def __init__(self, verifier, authority):
        self._verifier = verifier
        self._authority = {name: frozenset(roles) for name, roles in authority.items()}
        self._refused_peers = set()
        self._lock = threading.Lock()

    def intercept_service(self, continuation, details):
        token = dict(details.invocation_metadata or ()).get(METADATA_KEY)
        identity = self._verifier.identity(token)
        method = details.method.rsplit("/", 1)[-1]
        if identity is None:
            return _refusal(continuation(details), grpc.StatusCode.UNAUTHENTICATED,
                            f"{method} needs this job's credentials", self._log_once)
        if identity.role not in self._authority.get(method, ()):
            return _refusal(continuation(details), grpc.StatusCode.PERMISSION_DENIED,
                            f"{identity.name} may not call {method}", self._log_once)
        return continuation(details)

    def _log_once(self, peer, message):
        with self._lock:
            if peer in self._refused_peers:
                return
            self._refused_peers.add(peer)
        logger.warning("Refused a call from %s: %s (later refusals of it are not logged)",
                       peer, message)


def _refusal(handler, code, message, log):
    """A handler of the same kind as `handler` that ends the call with `code`, parsing
    nothing the caller sent."""

    def refuse(request_or_iterator, context):
        log(context.peer(), message)
        context.abort(code, message)

    if handler is None:  # no such method: gRPC answers UNIMPLEMENTED itself
        return None
    kind = (handler.request_streaming, handler.response_streaming)
    make = {(False, False): grpc.unary_unary_rpc_method_handler,
            (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler,
            (True, True): grpc.stream_stream_rpc_method_handler}[kind]
    return make(refuse)
