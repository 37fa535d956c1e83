"""The worker process: `python -m elastic_keras.worker --worker-id N --master-addr H:P ...`.

Exit status (`RoleExitCode`): OK when the master has no more tasks, and when SIGTERM
(preemption, scaling down) made the worker hand its task back and leave; MASTER_LOST when the
master has not answered for `MASTER_LOST_S`, so no orphan worker outlives its job;
LEAVE_TIMEOUT when leaving after SIGTERM took longer than `LEAVE_GRACE_S` (a call to an
unreachable master or parameter server still blocked), so a told-to-go worker always goes;
BAD_INPUT for bad flags.
"""

import logging
import os
import signal
import sys
import threading
import time

import grpc

from elastic_keras.common import auth, tls
from elastic_keras.common.config import WorkerConfig, parse_argv
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.exit_codes import RoleExitCode
from elastic_keras.common.log import setup_logging
from elastic_keras.common.master_client import HEARTBEAT_INTERVAL_S, MASTER_LOST_S, MasterClient
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.common.private_data import read_private
from elastic_keras.common.signals import set_from_handler
from elastic_keras.common.ps_client import PSClient
from elastic_keras.worker import strategies
from elastic_keras.worker.inference import Inference
from elastic_keras.worker.task_loop import TaskLoop
from elastic_keras.worker.trainer import Trainer

logger = logging.getLogger("elastic_keras.worker")

CLUSTER_WAIT_S = 300.0
# After SIGTERM the worker has this long to finish its minibatch, let its push land and hand
# its task back (the master, which SIGKILLs it after 30 s, re-queues the task in any case).
LEAVE_GRACE_S = 20.0


def _wait_for_cluster(master, worker_id, stop):
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while not stop.is_set():
        ready, addresses = master.get_cluster(worker_id)
        if ready:
            return addresses
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the parameter servers did not all register within {CLUSTER_WAIT_S:.0f} s"
            )
        stop.wait(0.2)
    return None


class Heartbeat(threading.Thread):
    """Tells the master every `HEARTBEAT_INTERVAL_S` that this worker lives.

    Registers again when a restarted master does not know the worker, and ends the process
    with `RoleExitCode.MASTER_LOST` once the master has been silent for `MASTER_LOST_S` (the main
    thread may then be blocked in a call to it).
    """

    def __init__(self, master, worker_id):
        super().__init__(name="heartbeat", daemon=True)
        self._master = master
        self._worker_id = worker_id
        self._done = threading.Event()
        self.ps_clients = []  # readdressed when a relaunched shard comes back elsewhere

    def run(self):
        last_answer = time.monotonic()
        while not self._done.wait(HEARTBEAT_INTERVAL_S):
            time_left = last_answer + MASTER_LOST_S - time.monotonic()
            try:
                answer = self._master.heartbeat("worker", self._worker_id,
                                                timeout_s=max(0.1, min(5.0, time_left)))
                last_answer = time.monotonic()
                if answer.register_again:
                    self._master.register_worker(self._worker_id)
                if self.ps_clients:
                    self._readdress(list(answer.ps_addresses))
            except grpc.RpcError as exc:
                silent = time.monotonic() - last_answer
                if silent >= MASTER_LOST_S:
                    logger.error("The master at %s has not answered for %.0f s: it is gone. "
                                 "Exiting so that no orphan worker lives on.",
                                 self._master.address, silent)
                    logging.shutdown()
                    os._exit(RoleExitCode.MASTER_LOST)
                    return
                logger.warning("The master did not answer a heartbeat (%s); silent for %.0f s",
                               exc.code().name, silent)

    def _readdress(self, addresses):
        if not addresses:
            return
        known = [a for client in self.ps_clients for a in client.addresses]
        if len(addresses) != len(known):
            logger.error("The master sent %d parameter-server addresses; this worker uses %d",
                         len(addresses), len(known))
            return
        moved = [f"{i} to {a}" for i, (a, old) in enumerate(zip(addresses, known)) if a != old]
        num_ps = self.ps_clients[0].num_ps
        for member, client in enumerate(self.ps_clients):
            client.readdress(addresses[member * num_ps:(member + 1) * num_ps])
        if moved:
            logger.warning("Parameter server %s (relaunched elsewhere)", ", ".join(moved))

    def close(self):
        self._done.set()


def _leave_on_sigterm(stop):
    """On SIGTERM: set `stop`, and end the process if leaving takes over `LEAVE_GRACE_S`."""

    def force_exit():
        logger.error("Could not leave within %.0f s of SIGTERM (a call to the master or a "
                     "parameter server still blocks); exiting now.", LEAVE_GRACE_S)
        logging.shutdown()
        os._exit(RoleExitCode.LEAVE_TIMEOUT)

    def on_sigterm(*_):
        if not stop.is_set():
            set_from_handler(stop)
            deadline = threading.Timer(LEAVE_GRACE_S, force_exit)
            deadline.daemon = True
            deadline.start()

    signal.signal(signal.SIGTERM, on_sigterm)


def main(argv=None):
    """Runs one worker until the master has no more tasks or it is told to leave."""
    config = parse_argv(WorkerConfig, sys.argv[1:] if argv is None else argv,
                        prog="python -m elastic_keras.worker")
    setup_logging(config.log_level)
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        _leave_on_sigterm(stop)
    try:
        token = read_private(config.credential_file, "--credential-file").decode()
        material = tls.of_role(config)
    except (ConfigError, UnicodeDecodeError) as exc:
        logger.error("Cannot start: %s (the master's engine passes these files)", exc)
        return RoleExitCode.BAD_INPUT
    spec = load_model_spec(config.model_zoo, config.model_def)
    master = MasterClient(config.master_addr, token=token, tls=material)
    master.register_worker(config.worker_id)
    heartbeat = Heartbeat(master, config.worker_id)
    heartbeat.start()
    try:
        addresses = _wait_for_cluster(master, config.worker_id, stop)
        if addresses is None:
            logger.info("Worker %d told to stop before it started", config.worker_id)
            return 0
        if len(addresses) != config.num_ps * config.members:
            logger.error("Cannot start: the master names %d parameter servers; --num-ps %d "
                         "x --members %d expected", len(addresses), config.num_ps,
                         config.members)
            return RoleExitCode.BAD_INPUT
        heartbeat.ps_clients = [
            PSClient(addresses[k * config.num_ps:(k + 1) * config.num_ps],
                     transfer=config.transfer, token=token, tls=material)
            for k in range(config.members)]
        _run_tasks(config, spec, master, heartbeat.ps_clients, stop)
    finally:
        heartbeat.close()
        for client in heartbeat.ps_clients:
            client.close()
        master.close()
    return 0


def _run_tasks(config, spec, master, ps_clients, stop):
    """Runs the master's tasks with one model per ensemble member (a training job: one)."""
    logger.info("Worker %d of job %s: parameter servers %s; sends %s", config.worker_id,
                config.job_name, ", ".join(a for c in ps_clients for a in c.addresses),
                ps_clients[0].transfer)
    members = [Trainer(spec, client, config.worker_id, config.embedding_threshold_params,
                       strategies.name_for(config), config.max_stale_retries, stop=stop,
                       fresh_names=k > 0)
               for k, client in enumerate(ps_clients)]
    inference = Inference(spec, members, config.ensemble_combiner)
    TaskLoop(config, spec, master, members[0], stop, inference).run()
