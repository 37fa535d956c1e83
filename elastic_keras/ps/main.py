"""The parameter-server process: serve one shard, register with the master, keep in touch.

Usage:

    python -m elastic_keras.ps --ps-id 0 --num-ps 1 --master-addr 127.0.0.1:5000 \\
        [--host 127.0.0.1] [--port 0] [--compression auto] [--chunk-bytes 4194304] \\
        [--transfer-dtype float32] [--job-name NAME] [--restore-from DIR] [--log-level info]

The process starts its gRPC server (port 0 lets the OS pick), registers its address with the
master, then every `HEARTBEAT_INTERVAL_S` sends a heartbeat and reports its model version
(more often while the job's last tasks run, as the master's answer asks).
After the master has been unreachable for a while, the next answer re-registers the address,
so a restarted master learns it again. With `--restore-from CHECKPOINT_DIR/ckpt-N`, the shard
first loads its state from that checkpoint (re-sharded if it was written by another number of
parameter servers), so InitModel from a worker keeps it.

Exit status (`RoleExitCode`): OK when the master says the job has finished, or on
SIGTERM/SIGINT (the server gets `STOP_GRACE_S` to finish calls in flight); MASTER_LOST when
the master has not answered for `MASTER_LOST_S`, so no orphan parameter server outlives its
job; BAD_INPUT for bad flags or a checkpoint that cannot be restored.
"""

import contextlib
import logging
import os
import signal
import sys
import threading
import time

import grpc

from elastic_keras.common import auth, rpc, tls
from elastic_keras.common.config import PSConfig, parse_argv
from elastic_keras.common.errors import CheckpointError, ConfigError
from elastic_keras.common.exit_codes import RoleExitCode
from elastic_keras.common.log import setup_logging
from elastic_keras.common.master_client import (
    HEARTBEAT_INTERVAL_S, MASTER_LOST_S, MasterClient, next_heartbeat_s,
)
from elastic_keras.common.private_data import read_private
from elastic_keras.common.signals import set_from_handler
from elastic_keras.ps.checkpoint import load_shards
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import (
    AUTHORITY, SERVER_THREADS, WAITING_PULLS, PServerServicer, add_to_server,
)
from elastic_keras.ps.table_lifecycle import ShardLifecycle

logger = logging.getLogger(__name__)

# Deadline of each call to the master; a heartbeat's is cut to the time left before
# MASTER_LOST_S, so the process exits close to that bound.
MASTER_CALL_DEADLINE_S = 5.0
STOP_GRACE_S = 1.0


def main(argv=None) -> int:
    """Runs a parameter server until the job finishes, a signal arrives or the master is lost.

    Args:
        argv: the flags (default: `sys.argv[1:]`), parsed into a `PSConfig`.

    Returns:
        The exit status (see the module docstring).
    """
    config = parse_argv(
        PSConfig, sys.argv[1:] if argv is None else argv, prog="python -m elastic_keras.ps"
    )
    setup_logging(config.log_level)
    stop = threading.Event()
    with _stop_on_signals(stop):
        return run(config, stop)


def run(config, stop):
    """Serves the shard described by `config` until done; `stop` set means shut down.

    Returns:
        The exit status.
    """
    policy = UpdatePolicy(
        grads_to_wait=config.grads_to_wait,
        max_staleness=config.max_staleness,
        lr_staleness_modulation=config.lr_staleness_modulation,
        round_timeout_s=config.sync_round_timeout_s,
    )
    try:
        secret = read_private(config.secret_file, "--secret-file")
        material = tls.of_role(config)
    except ConfigError as exc:
        logger.error("Cannot start: %s (the master's engine passes these files)", exc)
        return RoleExitCode.BAD_INPUT
    parameters = Parameters(policy, config.min_version, config.limits,
                            None if config.learning_rate < 0 else config.learning_rate,
                            ShardLifecycle(config.lifecycle, config.num_ps))
    if config.restore_from and not _restore(config, parameters):
        return RoleExitCode.BAD_INPUT
    transfer = config.transfer
    servicer = PServerServicer(parameters, transfer, config.ps_id, config.num_ps,
                               config.checkpoint_dir, max_waiting_pulls=WAITING_PULLS)
    server_auth = auth.ServerAuth(auth.Verifier(secret, config.job_name), AUTHORITY)
    wire = rpc.WireBytes()  # reported with the version, for the job's metrics
    try:
        server, port = _serve(config, servicer, server_auth, material, wire)
        address = rpc.advertised_address(config.host, port, config.advertise_host)
    except (OSError, ConfigError) as exc:
        logger.error("Cannot serve: %s", exc)
        return RoleExitCode.BAD_INPUT
    logger.info(
        "Parameter server %d of %d (job %s) serving on %s%s; sends %s.",
        config.ps_id, config.num_ps, config.job_name, address,
        " over TLS" if material else "", transfer,
    )
    token = auth.credential(secret, config.job_name, auth.Identity(auth.Role.PS, config.slot))
    master = MasterClient(config.master_addr, deadline_s=MASTER_CALL_DEADLINE_S, token=token,
                          tls=material)
    try:
        return _keep_in_touch(config, address, parameters, master, stop, wire)
    finally:
        master.close()
        server.stop(STOP_GRACE_S).wait()
        logger.info("Parameter server %d stopped.", config.ps_id)


def resident_bytes():
    """This process's resident memory in bytes (0 where /proc cannot tell)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def _serve(config, servicer, server_auth, material, wire=None):
    """The started server and its port: `--port`, or a free one if that is taken (a
    relaunched shard asks for its predecessor's, which another process may hold now)."""
    def create(port):
        return rpc.create_server([lambda s: add_to_server(servicer, s)], config.host, port,
                                 max_workers=SERVER_THREADS, auth=server_auth, tls=material,
                                 wire_bytes=wire)
    try:
        return create(config.port)
    except OSError:
        if not config.port:
            raise
        logger.warning("Port %d is taken; serving on a free one (workers learn it from the "
                       "master).", config.port)
        return create(0)


def _restore(config, parameters):
    """Restores the shard from `--restore-from`; False (logged) when that cannot be done."""
    path = config.restore_from
    started = time.monotonic()
    try:
        snapshot = load_shards(path, config.ps_id, config.num_ps)
        parameters.restore(snapshot)
    except CheckpointError as exc:
        logger.error("Cannot restore shard %d of %d from --restore-from %s: %s",
                     config.ps_id, config.num_ps, path, exc)
        return False
    rows = {name: len(state.ids) for name, state in snapshot.table_states.items()}
    logger.info(
        "Restored shard %d of %d from %s in %.1f s: model version %d, %d dense variables, "
        "rows per table %s.", config.ps_id, config.num_ps, path, time.monotonic() - started,
        snapshot.version, len(snapshot.dense), rows or "(no tables)",
    )
    return True


@contextlib.contextmanager
def _stop_on_signals(stop):
    """Sets `stop` on SIGTERM and SIGINT while inside (main thread only, where signals land)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        sig: signal.signal(sig, lambda *_: set_from_handler(stop))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _keep_in_touch(config, address, parameters, master, stop, wire):
    """Registers, then heartbeats and reports the version until the job ends; the exit status."""
    registered = False
    in_outage = False
    last_answer = time.monotonic()
    interval = HEARTBEAT_INTERVAL_S
    while not stop.is_set():
        time_left = last_answer + MASTER_LOST_S - time.monotonic()
        if time_left <= 0:
            logger.error(
                "The master at %s has not answered for %.0f s: it is gone. Exiting so that no "
                "orphan parameter server lives on.",
                config.master_addr, MASTER_LOST_S,
            )
            return RoleExitCode.MASTER_LOST
        try:
            if not registered:
                master.register_ps(config.slot, address)
                registered = True
                logger.info("Registered %s with the master at %s.", address, config.master_addr)
            answer = master.heartbeat(
                "ps", config.slot, timeout_s=min(MASTER_CALL_DEADLINE_S, time_left),
                round_size=parameters.round_size,
            )
            finished = answer.job_finished
            last_answer = time.monotonic()
            interval = next_heartbeat_s(answer)
            if in_outage or answer.register_again:
                in_outage = False
                master.register_ps(config.slot, address)
                logger.info("The master answers again; re-registered %s.", address)
            if finished:
                logger.info("The master says the job has finished; stopping.")
                return 0
            if answer.HasField("sync_round_size"):
                parameters.set_round_size(answer.sync_round_size)
            closed = parameters.close_expired_round()
            master.report_version(config.slot, parameters.version,
                                  parameters.staleness.counts, parameters.staleness.rejections,
                                  parameters.pending_pushes, parameters.applied_pushes,
                                  parameters.non_finite_pushes, parameters.table_stats,
                                  resident_bytes(), (wire.received, wire.sent))
            if closed:
                logger.warning(
                    "A synchronous round waited %.0f s for %d pushes; applied it with %d.",
                    parameters.policy.round_timeout_s, parameters.policy.grads_to_wait, closed,
                )
        except grpc.RpcError as exc:
            in_outage = registered
            interval = HEARTBEAT_INTERVAL_S
            logger.warning(
                "The master at %s did not answer (%s: %s); silent for %.0f s of %.0f s allowed.",
                config.master_addr, exc.code().name, exc.details(),
                time.monotonic() - last_answer, MASTER_LOST_S,
            )
        time_left = last_answer + MASTER_LOST_S - time.monotonic()
        stop.wait(max(0.0, min(interval, time_left)))
    logger.info("Stopping on signal.")
    return 0
