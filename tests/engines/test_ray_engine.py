"""The Ray engine (ray_actors.py) on a real Ray cluster on 127.0.0.1 that it starts itself
(ray_cluster.py): what it reports for each way a role can end, what reaches a role, and what
is left once the engine stops or its process is killed."""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from elastic_keras.common.engine_options import ClusterOptions
from elastic_keras.common.errors import ConfigError
from elastic_keras.master.instance_manager import ExitReason, RoleId, RoleSpec, RoleType
from elastic_keras.master.instance_manager.ray_actors import (
    RayEngineConfig, RayInstanceManager, WorkerActor, actor_options,
)
from elastic_keras.master.instance_manager.ray_cluster import (
    LocalRayCluster, check_host_reaches_nodes,
)
from tests.conftest import ROOT
from tests.e2e.conftest import wait_for
from tests.engines.process_marks import alive, describe, marked_processes

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.timeout(300)
WAIT_S = 60.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """One engine (and its cluster) for the module: a PS asks for more CPUs than any node
    has, so it is never placed (10 s, long enough for a worker to start on a busy machine)."""
    logs = tmp_path_factory.mktemp("ray-logs")
    lines = []
    options = ClusterOptions(ps_resource_request="cpu=512", pending_timeout=10,
                             env="EK_TEST_GREETING=hello")
    made = RayInstanceManager(RayEngineConfig("rayengine", options, str(logs), os.getcwd()),
                              on_line=lambda role, line: lines.append((role, line)))
    made.lines, made.logs = lines, logs
    yield made
    made.stop_all(1)


def _spec(index, seconds, code=0, files=(), role_type=RoleType.WORKER, args=()):
    return RoleSpec(RoleId(role_type, index), "tests.engines.sleepy_role",
                    (str(seconds), str(code), *args), files=files,
                    advertise_flag="--advertise-host" if role_type == RoleType.PS else "")


def _exits(engine, count):
    found = []
    wait_for(lambda: found.extend(engine.poll()) or len(found) >= count, WAIT_S,
             f"{count} role exits", left=lambda: found)
    return {e.role.name: e for e in found}


def _said(engine, role, prefix):
    for name, line in list(engine.lines):
        if name == role and line.startswith(prefix):
            return line[len(prefix):]
    return None


def test_exit_codes_output_and_private_data_come_back(engine):
    engine.start(_spec(0, 0, 0, files=(("--secret-file", b"s3cret"),)))
    engine.start(_spec(1, 0, 7, args=("--env", "EK_TEST_GREETING")))
    exits = _exits(engine, 2)
    assert (exits["worker-0"].exit_code, exits["worker-0"].reason) == (0, ExitReason.SUCCEEDED)
    assert (exits["worker-1"].exit_code, exits["worker-1"].reason) == (7, ExitReason.CRASHED)
    # Private data reaches the role through its environment, not its command line.
    assert _said(engine, "worker-0", "--secret-file=") == "s3cret"
    assert "--secret-file env:" in _said(engine, "worker-0", "argv ")
    assert "s3cret" not in _said(engine, "worker-0", "argv ")
    assert _said(engine, "worker-1", "--env=") == "hello"  # --env reaches every role
    log = (engine.logs / "worker-0.log").read_text()
    assert "up" in log and "s3cret" in log
    assert engine.running() == []


def test_stop_asks_first_and_kill_does_not(engine):
    engine.start(_spec(2, 120))
    engine.start(_spec(3, 120))
    wait_for(lambda: _said(engine, "worker-2", "pid ") and _said(engine, "worker-3", "pid "),
             WAIT_S, "both roles up")
    engine.stop(RoleId(RoleType.WORKER, 2), grace_s=10)
    engine.kill(RoleId(RoleType.WORKER, 3))
    exits = _exits(engine, 2)
    assert exits["worker-2"].exit_code == 0 and _said(engine, "worker-2", "bye") == ""
    assert exits["worker-3"].exit_code == -signal.SIGKILL
    assert exits["worker-3"].reason == ExitReason.KILLED
    assert not alive(int(_said(engine, "worker-3", "pid ")))


def test_a_killed_actor_is_told_apart_and_takes_its_role_with_it(engine):
    engine.start(_spec(4, 120))
    pid = int(wait_for(lambda: _said(engine, "worker-4", "pid "), WAIT_S, "worker-4 up"))
    actor = ray.get_actor("worker-4-0", namespace="elastic-keras-rayengine")
    assert actor._ray_actor_creation_function_descriptor.class_name == "WorkerActor"
    ray.kill(actor)
    exit_ = _exits(engine, 1)["worker-4"]
    assert exit_.reason == ExitReason.ACTOR_LOST and exit_.exit_code == -signal.SIGKILL
    assert exit_.describe().startswith("lost its Ray actor")
    wait_for(lambda: not alive(pid), 10, "the role to die with its actor")
    # The next launch of the role is a new actor.
    engine.start(_spec(4, 0, 0))
    assert _exits(engine, 1)["worker-4"].exit_code == 0


def test_a_taken_actor_name_moves_the_launch_on(engine, caplog):
    """As when an earlier run of the job, on a cluster that outlives it, still holds one."""
    squatter = ray.remote(WorkerActor).options(name="worker-6-0").remote()
    try:
        with caplog.at_level("INFO", logger="elastic_keras.master.instance_manager.ray_actors"):
            engine.start(_spec(6, 0, 0))
        assert _exits(engine, 1)["worker-6"].exit_code == 0
        assert "Created Ray actor worker-6-1 for worker-6" in caplog.text
    finally:
        ray.kill(squatter)


def test_a_role_no_node_can_place_is_unschedulable(engine):
    engine.start(_spec(0, 0, 0, role_type=RoleType.PS))
    exit_ = _exits(engine, 1)["ps-0"]
    assert exit_.reason == ExitReason.UNSCHEDULABLE
    assert "not placed and started within 10 s (it asks for num_cpus=512" in exit_.detail


def test_a_serving_role_advertises_its_node(engine):
    free = ClusterOptions()
    assert actor_options(free, RoleType.PS) == {"num_cpus": 0}
    # The engine's PS cannot be placed (see the fixture); a worker spec with the PS flag can.
    spec = _spec(5, 0, 0)
    engine.start(RoleSpec(spec.role, spec.module, spec.args, advertise_flag="--advertise-host"))
    _exits(engine, 1)
    assert _said(engine, "worker-5", "--advertise-host=") == "127.0.0.1"


def test_resource_flags_map_to_ray_placement():
    options = ClusterOptions(worker_resource_request="cpu=2,memory=1Gi,gpu=1")
    assert actor_options(options, RoleType.WORKER) == {
        "num_cpus": 2.0, "memory": 2**30, "num_gpus": 1.0}
    with pytest.raises(ConfigError, match="--worker-resource-limit applies to --engine "
                       "kubernetes only. Received: --worker-resource-limit 'cpu=2' with "
                       "--engine ray"):
        ClusterOptions(worker_resource_limit="cpu=2").check_engine("ray")
    with pytest.raises(ConfigError, match="Received: ephemeral-storage=1Gi"):
        actor_options(ClusterOptions(ps_resource_request="ephemeral-storage=1Gi"), RoleType.PS)


KILLED_MASTER = """
import sys, time
from elastic_keras.master.instance_manager import RoleId, RoleSpec, RoleType
from elastic_keras.master.instance_manager.ray_actors import RayEngineConfig, RayInstanceManager
engine = RayInstanceManager(RayEngineConfig("rayorphan", log_dir=sys.argv[1]),
                            on_line=lambda role, line: print(line, flush=True))
engine.start(RoleSpec(RoleId(RoleType.WORKER, 0), "tests.engines.sleepy_role", ("300", "0")))
time.sleep(600)
"""


def test_nothing_outlives_a_killed_master(tmp_path):
    """Ray's agents outlive a killed head and ignore SIGTERM; the cluster's keeper kills them."""
    script = tmp_path / "master.py"
    script.write_text(textwrap.dedent(KILLED_MASTER))
    env = {**os.environ, "EK_TEST_ORPHAN": str(tmp_path)}
    master = subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env,
                              stdout=subprocess.PIPE, text=True, cwd=os.getcwd())
    try:
        for line in master.stdout:
            if line.startswith("pid "):
                role = int(line.split()[1])
                break
        else:
            pytest.fail(f"the role never started; see {tmp_path / 'ray.log'}")
        marked = lambda: marked_processes("EK_TEST_ORPHAN", str(tmp_path))  # noqa: E731
        assert len(marked()) > 3  # the master, the keeper, the head, its agents, the actor...
        master.kill()
        master.wait()
        wait_for(lambda: not marked() and not alive(role), WAIT_S,
                 "every process of the job's cluster to end", left=lambda: describe(marked()))
    finally:
        if master.poll() is None:
            master.kill()


def test_a_ray_address_where_no_head_answers_is_a_clear_error():
    with socket.socket() as taken:  # bound, never listening: nothing answers there
        taken.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(ConfigError, match=f"--ray-address {address}: no Ray head answers"):
            RayInstanceManager(RayEngineConfig(options=ClusterOptions(ray_address=address)))


def test_a_loopback_host_is_refused_when_the_cluster_has_other_machines():
    """The check on `ray.nodes()`'s list (one machine here cannot hold a multi-node cluster)."""
    nodes = [{"Alive": True, "NodeManagerAddress": "192.0.2.2"},
             {"Alive": True, "NodeManagerAddress": "127.0.0.2"},
             {"Alive": False, "NodeManagerAddress": "10.1.1.2"}]
    check_host_reaches_nodes("127.0.0.1", nodes, "192.0.2.2")  # all on this machine
    nodes.append({"Alive": True, "NodeManagerAddress": "10.1.1.1"})
    check_host_reaches_nodes("0.0.0.0", nodes, "192.0.2.2")
    with pytest.raises(ConfigError, match=r"nodes elsewhere \(10.1.1.1\): give --host 0.0.0.0 "
                       "--tls auto. Received: --host 127.0.0.1"):
        check_host_reaches_nodes("127.0.0.1", nodes, "192.0.2.2")


def test_a_local_cluster_that_cannot_start_is_a_clear_error(tmp_path):
    cluster = LocalRayCluster(num_cpus=-1, log_path=str(tmp_path / "ray.log"))
    with pytest.raises(ConfigError, match="local Ray cluster did not start .* its head exited"):
        cluster.wait_ready()
    assert "CPU" in (tmp_path / "ray.log").read_text()  # Ray's own complaint, for the user


CLUSTER_LOST = """
import os, signal, sys, time
from elastic_keras.master.instance_manager import RoleId, RoleSpec, RoleType
from elastic_keras.master.instance_manager.ray_actors import RayEngineConfig, RayInstanceManager
from tests.engines.process_marks import marked_processes
engine = RayInstanceManager(RayEngineConfig("raylost", log_dir=sys.argv[1]))
worker = RoleSpec(RoleId(RoleType.WORKER, 0), "tests.engines.sleepy_role", ("300", "0"))
engine.start(worker)
log = os.path.join(sys.argv[1], "worker-0.log")
while not (os.path.exists(log) and "pid " in open(log).read()):
    time.sleep(0.2)
for pid in marked_processes("EK_TEST_LOST", sys.argv[1]):
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        if b"raylet/raylet" in f.read():
            os.kill(pid, signal.SIGKILL)
exits = []
deadline = time.monotonic() + 60
while not exits and time.monotonic() < deadline:
    exits = engine.poll()
    time.sleep(0.2)
print("exit", *((exits[0].reason.value, exits[0].detail) if exits else ["none"]), flush=True)
try:
    engine.start(worker)
except RuntimeError as exc:
    print("start", exc, flush=True)
engine.stop_all(1)
print("stopped", flush=True)
"""


def test_a_cluster_that_stops_under_the_job_ends_its_roles_and_refuses_launches(tmp_path):
    """Ray's head stops whole when one of its processes dies (here its raylet)."""
    script = tmp_path / "master.py"
    script.write_text(textwrap.dedent(CLUSTER_LOST))
    env = {**os.environ, "EK_TEST_LOST": str(tmp_path),  # the script imports tests.engines
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, cwd=os.getcwd(),
                          capture_output=True, text=True, timeout=180)
    out = done.stdout
    assert "exit actor_lost the job's Ray cluster stopped" in out, out + done.stderr[-3000:]
    assert "start Cannot start worker-0: the job's Ray cluster stopped" in out
    assert "stopped" in out
    wait_for(lambda: not marked_processes("EK_TEST_LOST", str(tmp_path)), WAIT_S,
             "every process of the stopped cluster to end",
             left=lambda: describe(marked_processes("EK_TEST_LOST", str(tmp_path))))
