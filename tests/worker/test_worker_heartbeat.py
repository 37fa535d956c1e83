"""The worker's heartbeat: re-registers with a restarted master, exits when it is gone."""

import os
import signal
import threading

import pytest

from elastic_keras.common.exit_codes import RoleExitCode
from elastic_keras.common import rpc
from elastic_keras.common.master_client import MasterClient
from elastic_keras.proto import master_pb2, master_pb2_grpc
from elastic_keras.worker import main as worker_main


class FakeMasterServicer(master_pb2_grpc.MasterServicer):
    """A real gRPC master service that knows no worker: every heartbeat asks to register."""

    def __init__(self):
        self.registered = threading.Event()

    def Heartbeat(self, request, context):
        return master_pb2.HeartbeatResponse(register_again=not self.registered.is_set())

    def RegisterWorker(self, request, context):
        self.registered.set()
        return master_pb2.RegisterWorkerResponse()


@pytest.fixture
def fast_heartbeat(monkeypatch):
    monkeypatch.setattr(worker_main, "HEARTBEAT_INTERVAL_S", 0.05)
    monkeypatch.setattr(worker_main, "MASTER_LOST_S", 1.0)


def test_a_worker_registers_again_when_the_master_does_not_know_it(fast_heartbeat):
    servicer = FakeMasterServicer()
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(servicer, s)])
    client = MasterClient(f"127.0.0.1:{port}")
    heartbeat = worker_main.Heartbeat(client, worker_id=3)
    heartbeat.start()
    try:
        assert servicer.registered.wait(10)
    finally:
        heartbeat.close()
        heartbeat.join(5)
        client.close()
        server.stop(0)


def test_a_worker_exits_when_the_master_is_gone(fast_heartbeat, monkeypatch):
    exits = []
    exited = threading.Event()
    monkeypatch.setattr(worker_main.os, "_exit",
                        lambda code: (exits.append(code), exited.set()))
    monkeypatch.setattr(worker_main.logging, "shutdown", lambda: None)
    server, port = rpc.create_server([lambda s: None])
    server.stop(0)  # nothing answers at this address any more
    client = MasterClient(f"127.0.0.1:{port}", deadline_s=0.2)
    heartbeat = worker_main.Heartbeat(client, worker_id=0)
    heartbeat.start()
    try:
        assert exited.wait(20)
        assert exits[0] == RoleExitCode.MASTER_LOST
    finally:
        heartbeat.close()
        heartbeat.join(5)
        client.close()


def test_a_worker_told_to_leave_exits_when_leaving_blocks(monkeypatch):
    exits = []
    exited = threading.Event()
    monkeypatch.setattr(worker_main, "LEAVE_GRACE_S", 0.3)
    monkeypatch.setattr(worker_main.os, "_exit",
                        lambda code: (exits.append(code), exited.set()))
    monkeypatch.setattr(worker_main.logging, "shutdown", lambda: None)
    previous = signal.getsignal(signal.SIGTERM)
    stop = threading.Event()
    try:
        worker_main._leave_on_sigterm(stop)
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.wait(5)
        assert not exited.is_set()  # leaving gets its grace period first
        assert exited.wait(5)
        assert exits == [RoleExitCode.LEAVE_TIMEOUT]
    finally:
        signal.signal(signal.SIGTERM, previous)
