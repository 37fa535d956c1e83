"""The worker process: `python -m elastic_keras.worker --worker-id N --master-addr H:P ...`."""

import logging
import sys
import time

from elastic_keras.common.config import WorkerConfig, parse_argv
from elastic_keras.common.log import setup_logging
from elastic_keras.common.master_client import MasterClient
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.common.ps_client import PSClient
from elastic_keras.common.tensor_stream import TransferOptions
from elastic_keras.worker.task_loop import TaskLoop
from elastic_keras.worker.trainer import Trainer

logger = logging.getLogger("elastic_keras.worker")

CLUSTER_WAIT_S = 300.0


def _wait_for_cluster(master, worker_id):
    deadline = time.monotonic() + CLUSTER_WAIT_S
    while True:
        ready, addresses = master.get_cluster(worker_id)
        if ready:
            return addresses
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the parameter servers did not all register within {CLUSTER_WAIT_S:.0f} s"
            )
        time.sleep(0.2)


def main(argv=None):
    """Runs one worker until the master has no more tasks; returns the exit code."""
    config = parse_argv(WorkerConfig, sys.argv[1:] if argv is None else argv,
                        prog="python -m elastic_keras.worker")
    setup_logging(config.log_level)
    spec = load_model_spec(config.model_zoo, config.model_def)
    master = MasterClient(config.master_addr)
    master.register_worker(config.worker_id)
    ps_client = PSClient(_wait_for_cluster(master, config.worker_id),
                         transfer=TransferOptions.of(config))
    logger.info("Worker %d of job %s: parameter servers %s; sends %s", config.worker_id,
                config.job_name, ", ".join(ps_client.addresses), ps_client.transfer)
    try:
        trainer = Trainer(spec, ps_client, config.worker_id, config.embedding_threshold_params,
                          config.sync, config.max_stale_retries, config.overlap)
        TaskLoop(config, spec, master, trainer).run()
    finally:
        ps_client.close()
        master.close()
    return 0
