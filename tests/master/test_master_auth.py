"""Who may call the master (master/servicer.py AUTHORITY and its binding of requests to
callers), over real gRPC on loopback with the master's own `ServerAuth`.

The roles are not run: `RecordingEngine` only records what the master would launch (the
credential files it hands each worker), which is all these tests need of an engine; the
local engine's delivery of those files is tested in test_local_instance_manager.py.
"""

import io

import grpc
import pytest

from elastic_keras.common import auth, rpc
from elastic_keras.common.config import JobConfig
from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.master.console import Console
from elastic_keras.master.instance_manager import InstanceManager, LocalEngineConfig
from elastic_keras.master.master import Master
from elastic_keras.master.servicer import AUTHORITY, MasterServicer
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.proto import master_pb2_grpc
from tests.conftest import ROOT

JOB = "auth-test"


class RecordingEngine(InstanceManager):
    config_type = LocalEngineConfig

    def __init__(self, config=None, on_line=None):
        self.started = []

    def start(self, spec):
        self.started.append(spec)

    def poll(self):
        return []

    def running(self):
        return list(self.started)

    def stop(self, role, grace_s):
        pass

    def kill(self, role):
        pass

    def stop_all(self, grace_s):
        pass


@pytest.fixture
def master():
    spec = load_model_spec(str(ROOT / "model_zoo"), "digits.digits_cnn")
    config = JobConfig(model_def="digits.digits_cnn", training_data="unused", num_ps=1,
                       job_name=JOB)
    master = Master(config, spec, engine=RecordingEngine(), console=Console(io.StringIO()))
    master.reports.tasks = TaskManager([("train-0", 100)], records_per_task=50, num_epochs=1,
                                       max_task_retries=0)
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(master), s)],
        auth=auth.ServerAuth(auth.Verifier(master._secret, JOB), AUTHORITY))
    master.address = master.roles.master_address = f"127.0.0.1:{port}"
    yield master
    server.stop(grace=None)


def token(master, role, index=0, incarnation=0):
    return auth.credential(master._secret, JOB, auth.Identity(auth.Role(role), index,
                                                               incarnation))


def worker_token(master, worker_id):
    """The credential the master handed the latest launch of `worker_id`."""
    (data,) = [dict(s.files)["--credential-file"] for s in master.roles.engine.started
               if s.name == f"worker-{worker_id}"][-1:]
    return data.decode()


def refused(master, token_, call):
    client = MasterClient(master.address, deadline_s=10.0, token=token_)
    try:
        with pytest.raises(grpc.RpcError) as error:
            call(client)
        return error.value.code()
    finally:
        client.close()


def test_calls_without_this_jobs_credential_are_unauthenticated(master):
    other_job = auth.credential(auth.new_secret(), JOB, auth.Identity(auth.Role.WORKER, 0))
    for bad in (None, "worker/0/0/0000", other_job, token(master, "worker")[:-1] + "x"):
        assert refused(master, bad, lambda c: c.get_task(0)) == \
            grpc.StatusCode.UNAUTHENTICATED
    assert refused(master, None, lambda c: c.register_ps(0, "127.0.0.1:9")) == \
        grpc.StatusCode.UNAUTHENTICATED
    assert master.membership.ps_addresses() == (False, [])  # nothing was touched


def test_each_role_calls_only_what_it_may_and_only_as_itself(master):
    ps, worker = token(master, "ps", 0), token(master, "worker", 0)
    assert refused(master, worker, lambda c: c.register_ps(0, "127.0.0.1:9")) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert refused(master, ps, lambda c: c.get_task(0)) == grpc.StatusCode.PERMISSION_DENIED
    assert refused(master, token(master, "ps", 1), lambda c: c.register_ps(0, "x:1")) == \
        grpc.StatusCode.PERMISSION_DENIED
    assert refused(master, ps, lambda c: c.scale(JOB, 3)) == grpc.StatusCode.PERMISSION_DENIED
    assert refused(master, ps, lambda c: c.report_version(5, 10**12)) == \
        grpc.StatusCode.PERMISSION_DENIED
    client = MasterClient(master.address, deadline_s=10.0, token=ps)
    client.register_ps(0, "127.0.0.1:9")
    client.close()
    assert master.membership.ps_addresses() == (True, ["127.0.0.1:9"])


def test_a_worker_acts_only_in_its_current_launch_and_on_its_own_tasks(master):
    master.roles.start_worker(0)
    master.roles.start_worker(1)
    first = worker_token(master, 0)
    assert first == token(master, "worker", 0, 0)
    one = MasterClient(master.address, deadline_s=10.0, token=worker_token(master, 1))
    zero = MasterClient(master.address, deadline_s=10.0, token=first)
    try:
        task = zero.get_task(0)
        assert task.task_id and master.tasks.holder(task.task_id) == 0
        assert refused(master, worker_token(master, 1), lambda c: c.get_task(0)) == \
            grpc.StatusCode.PERMISSION_DENIED  # worker 1 asking as worker 0
        one.report_task_result(1, task.task_id, 50, error="forged failure")
        assert master.tasks.holder(task.task_id) == 0 and master.tasks.tasks_failed == 0
        master.roles.start_worker(0)  # relaunched: its first launch's credential is void
        assert worker_token(master, 0) == token(master, "worker", 0, 1)
        assert refused(master, first, lambda c: c.get_task(0)) == \
            grpc.StatusCode.PERMISSION_DENIED
    finally:
        one.close()
        zero.close()
