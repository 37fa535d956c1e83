"""The TLS material of one run of a job, as the master hands it out.

With `--tls auto` the master makes a certificate authority for this run alone and issues a
certificate to itself and to every role by name; with `--tls-cert/--tls-key/--tls-ca` every
role presents the user's own; otherwise there is none (loopback only, see `config`).
"""

from elastic_keras.common import tls


class JobTls:
    """Made from the job's `JobConfig`; `own` is the master's material (None without TLS).

    Raises:
        ConfigError: the user's files cannot be read or are not PEM.
    """

    def __init__(self, config):
        self._authority = None
        self.own = None
        if config.tls == "auto":
            self._authority = tls.JobAuthority.create(config.job_name)
            self.own = self._authority.issue("master")
        elif config.tls_cert:
            self.own = tls.from_files(config.tls_ca, config.tls_cert, config.tls_key)

    def for_role(self, name):
        """The material role `name` gets: its own certificate, or the user's."""
        return self._authority.issue(name) if self._authority else self.own
