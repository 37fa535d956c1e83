"""Hostile and malformed requests against a live master.

The master of a job (its `Master` object, served over real gRPC on 127.0.0.1 with its own
`ServerAuth`; roles recorded, not run) is sent, on every method: calls without this job's
credentials (UNAUTHENTICATED), calls by a role the method is not for or as another role
(PERMISSION_DENIED), and, from hypothesis, requests of random values from the right role
and random bytes. Each gets a named status code, never UNKNOWN; the master keeps serving;
and the job's state (registered shards, tasks held and their progress, versions, push
counts, failures) changes only as a good request of the same caller could change it.
The value checks themselves are in tests/master/test_master_requests.py.
"""

import grpc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from elastic_keras.common import auth, rpc
from elastic_keras.common.master_client import MasterClient
from elastic_keras.master.servicer import AUTHORITY
from elastic_keras.proto import master_pb2
from tests.master.test_master_auth import JOB, master, token  # noqa: F401 - the fixture

CODES = grpc.StatusCode
NAMED = {CODES.OK, CODES.INVALID_ARGUMENT, CODES.PERMISSION_DENIED,
         CODES.FAILED_PRECONDITION, CODES.UNAVAILABLE}
SERVICE = master_pb2.DESCRIPTOR.services_by_name["Master"]
INT32, INT64 = st.integers(-2**31, 2**31 - 1), st.integers(-2**63, 2**63 - 1)
ROLE_OF = {"RegisterPS": "ps", "ReportVersion": "ps", "Heartbeat": "worker", "Scale": "client"}


def raw_call(master, token_, method, payload):
    channel = rpc.create_channel(master.address, "elastic_keras.Master", deadline_s=10,
                                 token=token_)
    try:
        channel.unary_unary(f"/elastic_keras.Master/{method}")(payload)
        return CODES.OK, ""
    except grpc.RpcError as error:
        return error.code(), error.details()
    finally:
        channel.close()


def job_state(master):
    """What no refused request may change."""
    tasks = master.tasks
    return (master.membership.ps_addresses(), master.membership.model_version,
            master.membership.applied_pushes(), tasks.running_tasks(), tasks.progress(),
            tasks.tasks_failed, tasks.failed, master.reports.model_version)


def still_serving(master):
    client = MasterClient(master.address, deadline_s=10.0, token=token(master, "worker", 0))
    try:
        client.get_cluster(worker_id=0)  # raises if the master does not answer
        return True
    finally:
        client.close()


@pytest.fixture
def launched(master):
    master.roles.start_worker(0)
    return master


@pytest.mark.parametrize("stranger", [None, "worker/0/0/00", auth.credential(
    auth.new_secret(), JOB, auth.Identity(auth.Role.WORKER, 0))])
def test_strangers_are_refused_on_every_method(launched, stranger):
    before = job_state(launched)
    for method in AUTHORITY:
        code, details = raw_call(launched, stranger, method, b"")
        assert code == CODES.UNAUTHENTICATED, (method, code, details)
    assert job_state(launched) == before and still_serving(launched)


def test_each_method_refuses_every_role_it_is_not_for(launched):
    before = job_state(launched)
    for method, roles in AUTHORITY.items():
        for role in set(auth.Role) - set(roles):
            code, _ = raw_call(launched, token(launched, role.value, 0), method, b"")
            assert code == CODES.PERMISSION_DENIED, (method, role)
    assert job_state(launched) == before and still_serving(launched)


REQUESTS = {
    "RegisterPS": st.builds(master_pb2.RegisterPSRequest, ps_id=INT32, address=st.text(max_size=40)),
    "ReportVersion": st.builds(
        master_pb2.ReportVersionRequest, ps_id=INT32, model_version=INT64,
        staleness_counts=st.lists(INT64, max_size=5), stale_rejections=INT64,
        pending_pushes=INT64, applied_pushes=st.dictionaries(INT32, INT64, max_size=3)),
    "Heartbeat": st.builds(master_pb2.HeartbeatRequest, role=st.sampled_from(["ps", "worker",
                                                                             "", "x"]),
                           id=INT32, round_size=INT32),
    "RegisterWorker": st.builds(master_pb2.RegisterWorkerRequest, worker_id=INT32),
    "GetCluster": st.builds(master_pb2.GetClusterRequest, worker_id=INT32),
    "ReportProgress": st.builds(master_pb2.ReportProgressRequest, worker_id=INT32,
                                task_id=INT64, records_done=INT64,
                                loss=st.floats(allow_nan=True), model_version=INT64,
                                minibatches=INT64),
    "ReportTaskResult": st.builds(master_pb2.ReportTaskResultRequest, worker_id=INT32,
                                  task_id=INT64, error=st.text(max_size=20),
                                  records_done=INT64, loss=st.floats(), model_version=INT64,
                                  abandoned=st.booleans(), minibatches=INT64),
    "Scale": st.builds(master_pb2.ScaleRequest, job_name=st.sampled_from([JOB, "", "other"]),
                       num_workers=INT32),
}


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_random_requests_from_the_right_role_get_named_answers(launched, data):
    """Values that are out of range, negative, for another id or another job: refused by
    name, or harmless (a report on a task nobody runs is ignored)."""
    method = data.draw(st.sampled_from(sorted(REQUESTS)))
    request = data.draw(REQUESTS[method])
    role = ROLE_OF.get(method, "worker")
    before = job_state(launched)
    code, details = raw_call(launched, token(launched, role, 0), method,
                             request.SerializeToString())
    assert code in NAMED, (method, request, code, details)
    if code != CODES.OK:
        assert details and job_state(launched) == before, (method, request, code)
    assert still_serving(launched)


@settings(deadline=None, suppress_health_check=list(HealthCheck))
@given(method=st.sampled_from(sorted(REQUESTS)), payload=st.binary(max_size=120))
def test_random_bytes_to_every_method_get_named_answers(launched, method, payload):
    code, details = raw_call(launched, token(launched, ROLE_OF.get(method, "worker"), 0),
                             method, payload)
    assert code in NAMED or (code == CODES.INTERNAL and "deserializ" in details.lower()), \
        (method, payload, code, details)
    assert still_serving(launched)
