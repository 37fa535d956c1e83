"""`python -m elastic_keras.ps` as a real process, against a minimal master on 127.0.0.1."""

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import grpc
import keras
import numpy as np
import pytest

from elastic_keras.common.exit_codes import RoleExitCode
from elastic_keras.common import auth, rpc
from elastic_keras.common.transfer import tensor_codec, tensor_stream
from elastic_keras.common.config import PSConfig
from elastic_keras.proto import master_pb2, master_pb2_grpc, pserver_pb2
from elastic_keras.ps import main as ps_main
from tests.credentials import job_keys

START_TIMEOUT_S = 60


class MinimalMaster(master_pb2_grpc.MasterServicer):
    """Records registrations and versions; answers heartbeats with `finished`."""

    def __init__(self):
        self.registrations = queue.Queue()
        self.registered = False
        self.finished = threading.Event()
        self._versions = []
        self.non_finite_pushes = 0  # as the last report says
        self._versions_changed = threading.Condition()

    def RegisterPS(self, request, context):
        self.registered = True
        self.registrations.put((request.ps_id, request.address))
        return master_pb2.RegisterPSResponse()

    def Heartbeat(self, request, context):
        return master_pb2.HeartbeatResponse(
            job_finished=self.finished.is_set(), register_again=not self.registered
        )

    def ReportVersion(self, request, context):
        with self._versions_changed:
            self._versions.append(request.model_version)
            self.non_finite_pushes = request.non_finite_pushes
            self._versions_changed.notify_all()
        return master_pb2.ReportVersionResponse()

    def wait_for_version(self, version, timeout_s):
        with self._versions_changed:
            return self._versions_changed.wait_for(lambda: version in self._versions, timeout_s)

    def wait_for_non_finite(self, count, timeout_s):
        with self._versions_changed:
            return self._versions_changed.wait_for(lambda: self.non_finite_pushes == count,
                                                   timeout_s)


def serve(servicer, port=0):
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(servicer, s)], port=port
    )
    servicer.server, servicer.address = server, f"127.0.0.1:{port}"
    return servicer


@pytest.fixture
def master():
    servicer = serve(MinimalMaster())
    yield servicer
    servicer.server.stop(0)


@pytest.fixture
def keys(tmp_path):
    return job_keys(tmp_path, "ps-test")


@pytest.fixture
def start_ps(tmp_path, keys):
    """Starts `python -m elastic_keras.ps` against a master; kills what is left at the end."""
    started = []

    def start(master_address, *flags, master_lost_s=None):
        """`master_lost_s`: the process's `MASTER_LOST_S` instead of the default 30 s."""
        log = open(tmp_path / f"ps{len(started)}.log", "w+")
        program = ["-m", "elastic_keras.ps"] if master_lost_s is None else [
            "-c", "import sys; from elastic_keras.ps import main; "
            f"main.MASTER_LOST_S = {master_lost_s}; sys.exit(main.main())"]
        process = subprocess.Popen(
            [sys.executable, *program, "--ps-id", "0", "--num-ps", "1",
             "--master-addr", master_address, "--job-name", "ps-test",
             "--secret-file", keys.secret_file, *flags],
            stdout=log, stderr=subprocess.STDOUT,
        )
        process.log = log
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.log.close()


def output(process):
    process.log.seek(0)
    return process.log.read()


def registered_address(master, process):
    try:
        ps_id, address = master.registrations.get(timeout=START_TIMEOUT_S)
    except queue.Empty:
        pytest.fail(f"the PS never registered; its output:\n{output(process)}")
    assert ps_id == 0
    return address


def wait_exit(process, timeout_s):
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the PS still runs after {timeout_s} s; its output:\n{output(process)}")


@pytest.mark.slow
def test_ps_registers_serves_reports_its_version_and_exits_when_job_finishes(
        master, start_ps, keys):
    process = start_ps(master.address)
    address = registered_address(master, process)
    host, port = address.rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0

    # Only the job's roles get in, each to what its role may call.
    for token, code in ((None, grpc.StatusCode.UNAUTHENTICATED),
                        (auth.credential(auth.new_secret(), "ps-test",  # another job's
                                         auth.Identity(auth.Role.WORKER, 0)),
                         grpc.StatusCode.UNAUTHENTICATED),
                        (keys.token("master"), grpc.StatusCode.PERMISSION_DENIED)):
        channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30,
                                     token=token)
        with pytest.raises(grpc.RpcError) as refused:
            rpc.Stub(channel, tensor_stream.PSERVER).PushGradients(
                pserver_pb2.PushGradientsRequest(worker_id=0, sequence=1))
        assert refused.value.code() == code
        channel.close()
    channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30,
                                 token=keys.token("worker", 1))
    with pytest.raises(grpc.RpcError) as refused:  # worker 1 pushing as worker 0
        rpc.Stub(channel, tensor_stream.PSERVER).PushGradients(
            pserver_pb2.PushGradientsRequest(worker_id=0, sequence=1))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    channel.close()

    channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30,
                                 token=keys.token("worker", 0))
    stub = rpc.Stub(channel, tensor_stream.PSERVER)
    assert not stub.PullDense(pserver_pb2.PullDenseRequest(known_version=-1)).initialized
    sgd = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(1.0)))
    stub.InitModel(pserver_pb2.InitModelRequest(
        dense=[tensor_codec.encode("w", np.zeros(2, np.float32))], optimizer_config=sgd))
    pushed = stub.PushGradients(pserver_pb2.PushGradientsRequest(
        worker_id=0, sequence=1, gradients=[tensor_codec.encode("w", np.ones(2, np.float32))]))
    assert pushed.model_version == 1
    with pytest.raises(grpc.RpcError) as refused:  # NaN: refused, counted, reported
        stub.PushGradients(pserver_pb2.PushGradientsRequest(
            worker_id=0, sequence=2,
            gradients=[tensor_codec.encode("w", np.array([np.nan, 1], np.float32))]))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    channel.close()
    assert master.wait_for_version(1, timeout_s=10), output(process)
    assert master.wait_for_non_finite(1, timeout_s=10), output(process)

    master.finished.set()
    assert wait_exit(process, 15) == 0, output(process)


@pytest.mark.slow
def test_ps_exits_zero_on_sigterm(master, start_ps):
    process = start_ps(master.address)
    registered_address(master, process)
    process.send_signal(signal.SIGTERM)
    assert wait_exit(process, 15) == 0, output(process)
    assert "Stopping on signal" in output(process)


@pytest.mark.slow
def test_ps_exits_nonzero_when_the_master_is_gone(master, start_ps):
    lost_s = 6.0  # the process's bound, for a short test: 30 s by default
    process = start_ps(master.address, master_lost_s=lost_s)
    registered_address(master, process)
    master.server.stop(0)
    gone_at = time.monotonic()
    code = wait_exit(process, lost_s + 15)
    assert code == RoleExitCode.MASTER_LOST != 0, output(process)
    assert time.monotonic() - gone_at >= lost_s - ps_main.HEARTBEAT_INTERVAL_S - 1
    assert "it is gone" in output(process)


@pytest.fixture
def quick_master_checks(monkeypatch):
    """Shrinks the process's master timings so `run` can be tested in-process quickly."""
    monkeypatch.setattr(ps_main, "MASTER_LOST_S", 3.0)
    # Not lower: gRPC cuts service-config deadlines by about 1 s (grpc/grpc#34547), so one
    # under 1.5 s fails at once.
    monkeypatch.setattr(ps_main, "MASTER_CALL_DEADLINE_S", 2.0)
    monkeypatch.setattr(ps_main, "HEARTBEAT_INTERVAL_S", 0.1)


def in_process_config(master, keys):
    return PSConfig(ps_id=0, num_ps=1, master_addr=master.address, job_name="ps-test",
                    secret_file=keys.secret_file)


def test_run_gives_up_when_no_master_ever_answers(master, keys, quick_master_checks, caplog):
    master.server.stop(0)
    started = time.monotonic()
    assert (ps_main.run(in_process_config(master, keys), threading.Event())
            == RoleExitCode.MASTER_LOST)
    assert 3.0 <= time.monotonic() - started < 15.0
    assert "it is gone" in caplog.text


def test_run_re_registers_with_a_restarted_master_and_stops_when_told(
    master, keys, quick_master_checks, monkeypatch
):
    # Long enough that a loaded machine restarts the master before the PS gives up on it.
    monkeypatch.setattr(ps_main, "MASTER_LOST_S", 20.0)
    stop = threading.Event()
    result = []
    thread = threading.Thread(
        target=lambda: result.append(ps_main.run(in_process_config(master, keys), stop))
    )
    thread.start()
    address = master.registrations.get(timeout=10)[1]
    master.server.stop(0).wait()
    restarted = serve(MinimalMaster(), port=int(master.address.rsplit(":", 1)[1]))
    try:
        assert restarted.registrations.get(timeout=30)[1] == address
        restarted.finished.set()
        thread.join(timeout=10)
        assert result == [0]
    finally:
        stop.set()
        thread.join(timeout=10)
        restarted.server.stop(0)


class PacedMaster(MinimalMaster):
    """Answers the shard's heartbeats with `paces` as `next_heartbeat_s`, one each, then
    says the job has finished."""

    def __init__(self, paces):
        super().__init__()
        self.paces = list(paces)

    def Heartbeat(self, request, context):
        answer = super().Heartbeat(request, context)
        if self.paces:
            answer.next_heartbeat_s = self.paces.pop(0)
        else:
            answer.job_finished = True
        return answer


class CountedStop(threading.Event):
    """A stop event whose waits return at once, each timeout kept in `waits`."""

    def __init__(self):
        super().__init__()
        self.waits = []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        return self.is_set()


def test_run_heartbeats_as_soon_as_the_master_asks_within_bounds(keys):
    paced = serve(PacedMaster([0, 0.5, 0.01, -1, float("nan"), float("inf"), 60, 0.2]))
    stop = CountedStop()
    try:
        assert ps_main.run(in_process_config(paced, keys), stop) == 0
    finally:
        paced.server.stop(0)
    usual = ps_main.HEARTBEAT_INTERVAL_S
    # 0, negative and NaN: the usual interval; too soon or too late: the nearest bound.
    assert stop.waits == pytest.approx([usual, 0.5, 0.2, usual, usual, usual, usual, 0.2],
                                       abs=0.01)


def test_bad_flags_exit_with_status_2():
    with pytest.raises(SystemExit) as info:
        ps_main.main(["--ps-id", "3", "--num-ps", "2", "--master-addr", "127.0.0.1:1"])
    assert info.value.code == 2


@pytest.mark.slow
def test_ps_advertises_the_address_it_is_told_and_takes_a_free_port_if_its_own_is_taken(
        master, start_ps):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        process = start_ps(master.address, "--port", str(port), "--advertise-host", "10.1.2.3")
        host, _, bound = registered_address(master, process).rpartition(":")
    assert host == "10.1.2.3" and int(bound) != port
    assert f"Port {port} is taken; serving on a free one" in output(process)
