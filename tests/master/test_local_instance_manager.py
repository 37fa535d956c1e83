"""The local engine runs roles as real `python -m <module>` children (instance_manager/local.py).

Each test writes tiny role modules into `tmp_path` and puts it on the children's PYTHONPATH.
"""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from elastic_keras.common import rpc
from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.config import JobConfig
from elastic_keras.common.errors import ConfigError
from elastic_keras.master.instance_manager import (
    ExitReason, LocalEngineConfig, LocalInstanceManager, RoleExit, RoleId, RoleSpec, RoleType,
    create,
)
from elastic_keras.proto import master_pb2_grpc

MODULES = {
    "say_and_exit": """
        import sys
        print("hello from", " ".join(sys.argv[1:]))
        print("second line")
        sys.exit(3)
    """,
    "sleeper": """
        import time
        print("ready", flush=True)
        time.sleep(600)
    """,
    "show_file": """
        import os, sys
        path = sys.argv[sys.argv.index("--key-file") + 1]
        print(oct(os.stat(path).st_mode & 0o777), open(path).read(), flush=True)
    """,
    "stubborn": """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(600)
    """,
}


@pytest.fixture
def modules(tmp_path):
    """A folder holding the role modules above, to put on PYTHONPATH."""
    folder = tmp_path / "modules"
    folder.mkdir()
    for name, source in MODULES.items():
        (folder / f"{name}.py").write_text(textwrap.dedent(source))
    return folder


class Lines:
    """Collects `on_line(role, line)` calls from the engine's pump threads."""

    def __init__(self):
        self._lock = threading.Lock()
        self._lines = []

    def __call__(self, role, line):
        with self._lock:
            self._lines.append((role, line))

    def of(self, role):
        with self._lock:
            return [line for name, line in self._lines if name == role]

    def wait_for(self, role, line, timeout_s=30.0):
        deadline = time.monotonic() + timeout_s
        while line not in self.of(role):
            assert time.monotonic() < deadline, f"{role} never printed {line!r}: {self.of(role)}"
            time.sleep(0.02)


@pytest.fixture
def lines():
    return Lines()


@pytest.fixture
def engine(modules, tmp_path, lines):
    manager = LocalInstanceManager(
        LocalEngineConfig(log_dir=str(tmp_path / "logs"), env={"PYTHONPATH": str(modules)}),
        on_line=lines,
    )
    yield manager
    manager.stop_all(grace_s=1.0)


def _poll_until_exit(engine, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        exits = engine.poll()
        if exits:
            return exits
        assert time.monotonic() < deadline, "no role exited in time"
        time.sleep(0.05)


def _gone(pid):
    """Whether process `pid` no longer runs (reaped, or a zombie nobody has reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_exit_code_lines_and_log_file_of_a_role(engine, lines, tmp_path):
    spec = RoleSpec(RoleId(RoleType.WORKER, 0), "say_and_exit", ("--flag", "value"))
    engine.start(spec)

    assert _poll_until_exit(engine) == [RoleExit(spec, 3)]
    assert not RoleExit(spec, 3).succeeded
    expected = ["hello from --flag value", "second line"]
    assert lines.of("worker-0") == expected
    assert (tmp_path / "logs" / "worker-0.log").read_text().splitlines() == expected
    assert engine.poll() == []  # reported once
    assert engine.running() == []


def test_running_lists_live_roles_only(engine, lines):
    sleeper = RoleSpec(RoleId(RoleType.PS, 0), "sleeper", ())
    quitter = RoleSpec(RoleId(RoleType.WORKER, 1), "say_and_exit", ())
    engine.start(sleeper)
    engine.start(quitter)
    assert _poll_until_exit(engine) == [RoleExit(quitter, 3)]
    lines.wait_for("ps-0", "ready")
    assert engine.running() == [sleeper]


def test_starting_a_running_role_again_is_refused(engine):
    spec = RoleSpec(RoleId(RoleType.WORKER, 0), "sleeper", ())
    engine.start(spec)
    with pytest.raises(ValueError, match="worker-0"):
        engine.start(RoleSpec(RoleId(RoleType.WORKER, 0), "say_and_exit", ()))
    assert engine.running() == [spec]


def test_stop_all_ends_sleeping_roles(engine, lines):
    specs = [RoleSpec(RoleId(RoleType.WORKER, i), "sleeper", ()) for i in range(2)]
    for spec in specs:
        engine.start(spec)
    for spec in specs:
        lines.wait_for(spec.name, "ready")
    pids = [engine.pid(spec.role) for spec in specs]

    started = time.monotonic()
    engine.stop_all(grace_s=10.0)
    assert time.monotonic() - started < 5.0  # SIGTERM is enough; no wait for the grace
    assert engine.running() == []
    assert all(_gone(pid) for pid in pids)


def test_a_role_that_ignores_sigterm_is_killed_after_the_grace(engine, lines):
    spec = RoleSpec(RoleId(RoleType.PS, 0), "stubborn", ())
    engine.start(spec)
    lines.wait_for("ps-0", "ready")  # its SIGTERM handler is in place
    pid = engine.pid(RoleId(RoleType.PS, 0))

    started = time.monotonic()
    engine.stop_all(grace_s=1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 10.0
    assert engine.running() == []
    assert _gone(pid)


def test_stop_ends_one_role_and_poll_reports_its_signal(engine, lines):
    keep = RoleSpec(RoleId(RoleType.PS, 0), "sleeper", ())
    stop = RoleSpec(RoleId(RoleType.WORKER, 0), "sleeper", ())
    engine.start(keep)
    engine.start(stop)
    lines.wait_for("worker-0", "ready")

    engine.stop(RoleId(RoleType.WORKER, 0), grace_s=5.0)
    assert _poll_until_exit(engine) == [RoleExit(stop, -signal.SIGTERM)]
    assert engine.running() == [keep]


def test_roles_start_reliably_beside_a_busy_grpc_server(engine):
    # The master launches roles while its gRPC server and channels are busy. Children must
    # not inherit gRPC's threads through fork handlers: those could abort them before exec.
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(
            master_pb2_grpc.MasterServicer(), s)]  # every method answers UNIMPLEMENTED
    )
    client = MasterClient(f"127.0.0.1:{port}", deadline_s=1.0)
    stop = threading.Event()

    def busy():
        while not stop.is_set():
            try:
                client.heartbeat("ps", 0)
            except grpc.RpcError:
                pass

    callers = [threading.Thread(target=busy, daemon=True) for _ in range(2)]
    for caller in callers:
        caller.start()
    try:
        codes = []
        for batch in range(4):
            specs = [RoleSpec(RoleId(RoleType.WORKER, 10 * batch + i), "say_and_exit", ())
                     for i in range(10)]
            for spec in specs:
                engine.start(spec)
            exits = []
            while len(exits) < len(specs):
                exits += _poll_until_exit(engine)
            codes += [e.exit_code for e in exits]
    finally:
        stop.set()
        for caller in callers:
            caller.join()
        client.close()
        server.stop(grace=None)
    assert codes == [3] * 40


def test_create_builds_the_named_engine_from_its_own_config(tmp_path):
    job = JobConfig(model_def="m.m", training_data="d", output=str(tmp_path / "out"))
    engine = create("local", job)
    assert isinstance(engine, LocalInstanceManager)
    assert LocalEngineConfig.from_job(job).log_dir == str(tmp_path / "out" / "logs")
    assert (tmp_path / "out" / "logs").is_dir()
    with pytest.raises(ConfigError, match=r"one of \[.*'local'.*\]. Received: --engine 'k8s'"):
        create("k8s", job)


@pytest.mark.parametrize("code, reason", [
    (0, ExitReason.SUCCEEDED), (1, ExitReason.CRASHED), (2, ExitReason.BAD_INPUT),
    (3, ExitReason.LEAVE_TIMEOUT), (4, ExitReason.MASTER_LOST), (-9, ExitReason.KILLED),
    (70, ExitReason.CRASHED),
])
def test_an_exit_says_why_the_role_stopped(code, reason):
    exit_ = RoleExit(RoleSpec(RoleId(RoleType.PS, 1), "m", ()), code)
    assert exit_.reason == reason and exit_.to_json() == {
        "role": "ps-1", "exit_code": code, "reason": reason.value}
    assert ("SIGKILL" in exit_.describe()) == (code == -9)


# Prints its role's pid once the role runs (and has written its only line, so the role
# cannot die of a broken pipe instead), then waits to be killed.
PARENT = """
    import sys, threading, time
    from elastic_keras.master.instance_manager import (
        LocalEngineConfig, LocalInstanceManager, RoleId, RoleSpec, RoleType,
    )

    ready = threading.Event()
    engine = LocalInstanceManager(LocalEngineConfig(env={"PYTHONPATH": sys.argv[1]}),
                                  on_line=lambda role, line: ready.set())
    worker = RoleId(RoleType.WORKER, 0)
    engine.start(RoleSpec(worker, "sleeper", ()))
    ready.wait(60)
    print(engine.pid(worker), flush=True)
    time.sleep(600)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_roles_die_with_a_killed_parent(modules, tmp_path):
    script = tmp_path / "parent.py"
    script.write_text(textwrap.dedent(PARENT))
    parent = subprocess.Popen(
        [sys.executable, str(script), str(modules)], stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert not _gone(child)
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()

    deadline = time.monotonic() + 10.0
    while not _gone(child):
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            pytest.fail(f"role pid {child} outlived its killed parent")
        time.sleep(0.05)


def test_private_files_reach_the_role_owner_only_and_go_with_the_engine(engine, lines):
    spec = RoleSpec(RoleId(RoleType.WORKER, 4), "show_file", ("--x", "1"),
                    files=(("--key-file", b"not-on-the-command-line"),))
    engine.start(spec)
    assert _poll_until_exit(engine)[0].exit_code == 0
    (line,) = [line for line in lines.of("worker-4") if line.startswith("0o")]
    assert line == "0o600 not-on-the-command-line"
    private_dir = engine._private_dir
    assert os.stat(private_dir).st_mode & 0o777 == 0o700
    engine.stop_all(grace_s=1.0)
    assert not os.path.exists(private_dir)
