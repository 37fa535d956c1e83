"""Private data a role reads at start (the job's secret, a credential, a TLS key): how an
engine hands it over without it ever appearing on a command line.

A flag such as `--secret-file` names either a file that only its owner can read (the local
and Ray engines write one, mode 0600) or `env:NAME`, an environment variable holding the data
base64-encoded (the Kubernetes engine: a Secret's key mapped into the pod's environment
with `secretKeyRef`). A variable is removed from the environment once read, so processes the
role starts do not inherit it.

Example:

    >>> import os
    >>> os.environ["DEMO_SECRET"] = "aGk="
    >>> read_private(env_source("DEMO_SECRET"), "--secret-file")
    b'hi'
    >>> "DEMO_SECRET" in os.environ
    False
"""

import base64
import binascii
import os
import stat

from elastic_keras.common.errors import ConfigError

ENV_PREFIX = "env:"
MAX_BYTES = 1 << 16


def env_name(flag):
    """The environment variable an engine passes `flag`'s private data in
    (`--secret-file` -> `EK_SECRET_FILE`)."""
    return "EK_" + flag.lstrip("-").replace("-", "_").upper()


def env_source(name):
    """The flag value that reads private data from environment variable `name`."""
    return ENV_PREFIX + name


def encode_for_env(data):
    """`data` (bytes or str) as the text an `env:` variable holds."""
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode("ascii")


def write_private(path, data):
    """Writes `data` (bytes or str) to a new file at `path` that only its owner can read."""
    if isinstance(data, str):
        data = data.encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode under O_CREAT
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def read_private(source, flag):
    """The bytes that flag `flag` names: an owner-only file, or `env:NAME`.

    Raises:
        ConfigError: nothing is named; the file cannot be read, another user owns it or others
            can read it; the variable is unset or not base64.
    """
    if not source:
        raise ConfigError(f"{flag} is required: the job's roles call each other with "
                          "credentials. Received: nothing")
    if source.startswith(ENV_PREFIX):
        return _read_env(source[len(ENV_PREFIX):], flag)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError as exc:
        raise ConfigError(f"{flag} {source}: cannot be read: {exc.strerror}") from exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{flag} {source} must be a file only its owner can read (mode 0600, owned by "
                f"uid {os.getuid()}). Received: mode {stat.S_IMODE(info.st_mode):04o}, "
                f"uid {info.st_uid}"
            )
        return os.read(fd, MAX_BYTES)
    finally:
        os.close(fd)


def _read_env(name, flag):
    text = os.environ.pop(name, None)
    if text is None:
        raise ConfigError(f"{flag} env:{name}: the environment has no variable {name}. "
                          "Received: it unset")
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ConfigError(f"{flag} env:{name} must hold base64 text. Received: "
                          f"{len(text)} characters that are not") from exc
