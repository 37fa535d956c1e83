"""Job credentials for tests that start roles as the master does (see `common/auth.py`)."""

import dataclasses
import os

from elastic_keras.common import auth
from elastic_keras.common.private_data import write_private

DEFAULT_JOB = "elastic-keras"  # JobConfig's default --job-name


@dataclasses.dataclass(frozen=True)
class JobKeys:
    """A job's secret, in an owner-only file as a parameter server gets it."""

    job_name: str
    secret: bytes
    secret_file: str

    def token(self, role, index=0, incarnation=0):
        return auth.credential(self.secret, self.job_name,
                               auth.Identity(auth.Role(role), index, incarnation))

    def credential_file(self, worker_id, incarnation=0):
        """A worker's credential, in an owner-only file as a worker gets it."""
        path = os.path.join(os.path.dirname(self.secret_file),
                            f"worker-{worker_id}-{incarnation}.credential")
        write_private(path, self.token("worker", worker_id, incarnation))
        return path


def job_keys(directory, job_name=DEFAULT_JOB):
    secret = auth.new_secret()
    path = os.path.join(str(directory), f"{job_name}.secret")
    write_private(path, secret)
    return JobKeys(job_name, secret, path)
