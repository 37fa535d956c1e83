"""TLS between a job's roles: a per-job certificate authority, or the user's own certificates.

With `--tls auto` the master makes a certificate authority for the job alone and issues each
role (and the `elastic-keras scale` client) a certificate of its own; every channel is
mutually authenticated: a server accepts only clients whose certificate the job's CA signed,
and a client only servers whose certificate it signed. Certificates name the job
(`target_name`) rather than a host, so a role is reached wherever it runs; the caller's
identity within the job is its credential (`auth`), which TLS now also keeps secret.

With `--tls-cert/--tls-key/--tls-ca` every role presents the user's certificate, checked
against the user's CA, and servers are verified by the host name they are reached at.

Example:

    >>> authority = JobAuthority.create("demo")
    >>> material = authority.issue("ps-0")
    >>> material.target_name
    'demo.elastic-keras'
"""

import dataclasses
import datetime
import ipaddress

import grpc

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.private_data import read_private

LOOPBACK_NAMES = ("localhost",)
_VALID_DAYS = 30


@dataclasses.dataclass(frozen=True)
class TlsMaterial:
    """What one role needs for TLS: the CA's certificate, its own certificate and key (PEM),
    and the name servers are verified by ("" : the host name they are reached at)."""

    ca: bytes
    cert: bytes
    key: bytes
    target_name: str = ""

    def server_credentials(self):
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self):
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def channel_options(self):
        return [("grpc.ssl_target_name_override", self.target_name)] if self.target_name else []

    def files(self):
        """The `(flag, bytes)` private files that hand this material to a role (its
        `target_name` goes as the plain flag `--tls-target-name`)."""
        return (("--tls-ca", self.ca), ("--tls-cert", self.cert), ("--tls-key", self.key))


def check_job_settings(job):
    """Checks a `JobConfig`'s TLS flags: settings that fit together, and TLS whenever a
    role binds beyond loopback.

    Raises:
        ConfigError: naming the flags and what was received.
    """
    own = {"--tls-cert": job.tls_cert, "--tls-key": job.tls_key, "--tls-ca": job.tls_ca}
    given = [flag for flag, value in own.items() if value]
    if given and len(given) < 3:
        missing = sorted(set(own) - set(given))
        raise ConfigError(f"{', '.join(given)} needs {' and '.join(missing)} as well. "
                          f"Received: {' '.join(f'{f} {own[f]}' for f in given)}")
    if given and job.tls == "auto":
        raise ConfigError("--tls auto makes the job's certificates; it excludes --tls-cert, "
                          "--tls-key and --tls-ca. Received: both")
    if not is_loopback(job.host) and job.tls == "off" and not given:
        raise ConfigError(
            f"--host {job.host} lets other machines reach the job's roles, which then need "
            "TLS: add --tls auto (a certificate authority for this job alone) or your own "
            f"--tls-cert/--tls-key/--tls-ca. Received: --host {job.host} with --tls off"
        )


def target_name(job_name):
    """The name every certificate of job `job_name`'s own CA carries."""
    safe = "".join(c if c.isalnum() or c == "-" else "-" for c in job_name.lower())
    return f"{safe.strip('-') or 'job'}.elastic-keras"


class JobAuthority:
    """A certificate authority for one job (`--tls auto`), kept in the master's memory."""

    def __init__(self, job_name, key, cert):
        self.job_name, self._key, self._cert = job_name, key, cert

    @classmethod
    def create(cls, job_name):
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                             f"elastic-keras CA of {job_name}"[:64])])
        cert = (_builder(name, name, key.public_key())
                .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
                .sign(key, _sha256()))
        return cls(job_name, key, cert)

    def issue(self, role_name):
        """A key and a certificate for `role_name` (e.g. "ps-0"), as `TlsMaterial`."""
        from cryptography import x509
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, role_name[:64])])
        cert = (_builder(subject, self._cert.subject, key.public_key())
                .add_extension(x509.SubjectAlternativeName(
                    [x509.DNSName(target_name(self.job_name))]), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(self._key, _sha256()))
        return TlsMaterial(_pem(self._cert), _pem(cert), _key_pem(key),
                           target_name(self.job_name))


def from_files(ca_path, cert_path, key_path, target="", flags=("--tls-ca", "--tls-cert",
                                                                "--tls-key")):
    """The user's own TLS material read from PEM files.

    Raises:
        ConfigError: a file cannot be read or holds no PEM block (naming its flag).
    """
    contents = []
    for flag, path in zip(flags, (ca_path, cert_path, key_path)):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ConfigError(f"{flag} {path}: cannot be read: {exc.strerror}") from exc
        contents.append(_checked_pem(data, flag, path))
    return TlsMaterial(*contents, target_name=target)


def _checked_pem(data, flag, source):
    if b"-----BEGIN " not in data:
        raise ConfigError(f"{flag} {source} must hold PEM. Received: {len(data)} bytes "
                          "without a '-----BEGIN' line")
    return data


def of_role(config):
    """A role's `TlsMaterial` from the files its engine delivered (`--tls-ca`, `--tls-cert`,
    `--tls-key`), or None when the job runs without TLS.

    Raises:
        ConfigError: a file cannot be read or is not PEM.
    """
    if not (config.tls_ca or config.tls_cert or config.tls_key):
        return None
    contents = [_checked_pem(read_private(source, flag), flag, source) for flag, source in
                (("--tls-ca", config.tls_ca), ("--tls-cert", config.tls_cert),
                 ("--tls-key", config.tls_key))]
    return TlsMaterial(*contents, target_name=config.tls_target_name)


def is_loopback(host):
    """Whether binding `host` keeps a server on this machine."""
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _builder(subject, issuer, public_key):
    from cryptography import x509

    now = datetime.datetime.now(datetime.timezone.utc)
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer)
            .public_key(public_key).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=_VALID_DAYS)))


def _sha256():
    from cryptography.hazmat.primitives import hashes

    return hashes.SHA256()


def _pem(cert):
    from cryptography.hazmat.primitives import serialization

    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key):
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
