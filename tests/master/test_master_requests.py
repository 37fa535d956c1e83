"""The master checks the values of its callers' requests (master/servicer.py): a bad one is
INVALID_ARGUMENT naming the field and what was received, and changes nothing; a worker
holds at most one task (master/reports.py `get_task`). Real gRPC on loopback, with the
master's own `ServerAuth` and the credentials it makes for its roles.
"""

import grpc
import pytest

from elastic_keras.common import auth
from elastic_keras.common.master_client import MasterClient
from elastic_keras.proto import master_pb2
from tests.master.test_master_auth import JOB, master, token  # noqa: F401 - the fixture


def call(master, role, method, request, index=0):
    """`method(request)` as `role` number `index`; a worker is launched first (only a
    launched worker's credential is good)."""
    if role == "worker" and not master.roles.is_current(token_identity(role, index)):
        master.roles.start_worker(index)
    client = MasterClient(master.address, deadline_s=10.0, token=token(master, role, index))
    try:
        return getattr(client._stub, method)(request)
    finally:
        client.close()


def token_identity(role, index):
    return auth.Identity(auth.Role(role), index, 0)


def rejected(master, role, method, request):
    with pytest.raises(grpc.RpcError) as error:
        call(master, role, method, request)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT, error.value.details()
    return error.value.details()


@pytest.mark.parametrize("address", ["", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:99999",
                                     ":5000", "host:port"])
def test_a_shard_registers_only_a_host_and_port(master, address):
    details = rejected(master, "ps", "RegisterPS",
                       master_pb2.RegisterPSRequest(ps_id=0, address=address))
    assert f"address must be host:port. Received: address={address!r}" in details
    assert master.membership.ps_addresses() == (False, [])


def test_reports_name_a_shard_of_the_job(master):
    # A credential for shard 5 of a 1-shard job can exist only if forged with the secret.
    details = rejected(master, "ps", "ReportVersion", master_pb2.ReportVersionRequest(ps_id=0,
                       model_version=-1))
    assert "model_version must not be negative. Received: model_version=-1" in details
    details = rejected(master, "ps", "ReportVersion", master_pb2.ReportVersionRequest(
        ps_id=0, model_version=3, applied_pushes={7: -2}))
    assert "applied_pushes must map" in details
    details = rejected(master, "ps", "ReportVersion", master_pb2.ReportVersionRequest(
        ps_id=0, staleness_counts=[0] * 70000))
    assert "Received: 70000 counts" in details
    assert master.membership.model_version == 0 and master.membership.applied_pushes() == {}


@pytest.mark.parametrize("field, value", [("records_done", -1), ("minibatches", -5),
                                          ("model_version", -3), ("task_id", -1)])
def test_worker_reports_with_negative_counts_change_nothing(master, field, value):
    task = call(master, "worker", "GetTask", master_pb2.GetTaskRequest(worker_id=0)).task
    request = dict(worker_id=0, task_id=task.task_id, records_done=10)
    details = rejected(master, "worker", "ReportTaskResult",
                       master_pb2.ReportTaskResultRequest(**{**request, field: value}))
    assert f"{field} must not be negative. Received: {field}={value}" in details
    assert master.tasks.holder(task.task_id) == 0 and master.tasks.records_done(task.task_id) == 0


def test_a_result_names_only_shards_of_the_job(master):
    task = call(master, "worker", "GetTask", master_pb2.GetTaskRequest(worker_id=0)).task
    details = rejected(master, "worker", "ReportTaskResult", master_pb2.ReportTaskResultRequest(
        worker_id=0, task_id=task.task_id, records_done=50,
        dropped=[master_pb2.DroppedPushes(ps_id=9, reason="stale")]))
    assert "ps_id must be in [0, 1). Received: ps_id=9" in details
    assert master.tasks.holder(task.task_id) == 0


def test_heartbeats_name_a_role(master):
    details = rejected(master, "worker", "Heartbeat", master_pb2.HeartbeatRequest(role="boss"))
    assert "role must be 'ps' or 'worker'. Received: role='boss'" in details


@pytest.mark.parametrize("num_workers", [0, -1, 1025, 2**31 - 1])
def test_scale_stays_within_max_workers(master, num_workers):
    details = rejected(master, "client", "Scale",
                       master_pb2.ScaleRequest(job_name=JOB, num_workers=num_workers))
    assert f"from 1 to --max-workers 1024. Received: num_workers={num_workers}" in details


def test_a_worker_holds_at_most_one_task(master):
    """Asking again hands back what the worker held: however often it asks, the queue does
    not drain into one worker (the attack: one id took all 57 tasks)."""
    tasks = [call(master, "worker", "GetTask", master_pb2.GetTaskRequest(worker_id=0)).task
             for _ in range(5)]
    held = [t for t in tasks if master.tasks.holder(t.task_id) == 0]
    assert len(held) == 1 and held[0].task_id == tasks[-1].task_id
    assert len(master.tasks.running_tasks()) == 1
    # The one handed back is trained again from where it was (nothing reported: its start).
    other = call(master, "worker", "GetTask", master_pb2.GetTaskRequest(worker_id=0),
                 index=0).task
    assert (other.start, other.end) in {(t.start, t.end) for t in tasks}
