"""The master: one readable loop that runs a job from launch to summary.

It lists the data, starts the parameter servers and workers through an `InstanceManager`,
hands out tasks, watches the roles, ends epochs with an evaluation round, exports the model
and writes `job_summary.json`. Mechanism lives elsewhere (task manager, engines, servicer);
this file holds the policy.
"""

import logging
import os
import threading
import time

from elastic_keras.common import rpc
from elastic_keras.common.config import to_argv
from elastic_keras.common.metrics import MetricSums
from elastic_keras.common.ps_client import PSClient
from elastic_keras.data.shards import list_shards
from elastic_keras.master import instance_manager
from elastic_keras.master.console import Console
from elastic_keras.master.export import export_saved_model, sample_features
from elastic_keras.master.instance_manager import RoleSpec, RoleType
from elastic_keras.master.membership import Membership
from elastic_keras.master.servicer import MasterServicer
from elastic_keras.master.summary import JobStatus, JobSummary
from elastic_keras.master.task_manager import TaskManager, TaskType
from elastic_keras.master.throughput import Throughput
from elastic_keras.proto import master_pb2_grpc

logger = logging.getLogger(__name__)

PS_REGISTRATION_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
ROLE_EXIT_GRACE_S = 10.0  # after a good end, how long roles get to exit on their own
_TICK_S = 0.2


class Master:
    """Runs one job described by `config` with the checked model module `spec`.

    Args:
        config: the job's `JobConfig`.
        spec: the loaded and checked `ModelSpec`.
        engine: the `InstanceManager` that runs roles (default: local subprocesses).
        console: where progress and role lines go (default: stderr).
    """

    def __init__(self, config, spec, engine=None, console=None):
        self.config = config
        self.spec = spec
        self.console = console or Console(show_role_info=config.log_level == "debug")
        self.engine = engine  # the local engine by default, made once the data checks out
        self.membership = Membership(config.num_ps)
        self.throughput = Throughput()
        self.job_finished = False      # tells roles to exit
        self.no_more_tasks = False     # tells workers to exit
        self.tasks = None
        self._eval_sums = MetricSums()
        self._evaluations = []
        self._role_exits = []
        self._error = ""
        self._versions_lock = threading.Lock()
        self._model_version = 0
        self._shards = []
        self._first_task_at = None  # training time counts from the first task handed out
        self._training_ended_at = None

    # -- called by the servicer --------------------------------------------------------------

    def get_task(self, worker_id):
        if self.tasks is None or self.no_more_tasks:
            return None
        task = self.tasks.get(worker_id)
        if task is not None and self._first_task_at is None:
            self._first_task_at = time.time()
        return task

    def report_progress(self, worker_id, task_id, records_done, loss, model_version):
        self._note_version(model_version)
        before = self._records_of(task_id)
        self.tasks.report_progress(task_id, records_done)
        self.throughput.add(max(0, self._records_of(task_id) - before), loss)

    def report_task_result(self, worker_id, task_id, records_done, error, loss,
                           model_version, metric_states):
        self._note_version(model_version)
        before = self._records_of(task_id)
        task, outcome = self.tasks.report_result(task_id, records_done, error)
        if task is None:
            return
        if task.type == TaskType.TRAINING:
            trained = records_done if error else task.num_records
            self.throughput.add(max(0, trained - before), None if error else loss)
        elif outcome == "done":
            self._eval_sums.add(metric_states)
        if error:
            logger.warning("Worker %d failed %s task %d (%s): %s", worker_id,
                           task.type.value, task_id, outcome, error)

    def _records_of(self, task_id):
        return self.tasks.records_done(task_id)

    def _note_version(self, version):
        with self._versions_lock:
            self._model_version = max(self._model_version, version)

    @property
    def sync_round_size(self):
        """Pushes that close a synchronous round now (see `HeartbeatResponse`)."""
        if self.tasks is None:
            return self.config.grads_to_wait
        waiting, running = self.tasks.training_load()
        if waiting:
            return self.config.grads_to_wait
        return min(self.config.grads_to_wait, running)

    @property
    def model_version(self):
        with self._versions_lock:
            return max(self._model_version, self.membership.model_version)

    # -- the job -------------------------------------------------------------------------------

    def run(self):
        """Runs the job to its end and returns its `JobSummary` (also written to --output)."""
        started = time.time()
        server = None
        # Bad data ends the job here, before anything is launched or written.
        self._shards = list_shards(self.config.training_data, self.config.index_cache_dir)
        eval_shards = (
            list_shards(self.config.validation_data, self.config.index_cache_dir,
                        flag="--validation-data")
            if self.config.validation_data else []
        )
        self.tasks = TaskManager(
            [(s.path, s.num_records) for s in self._shards],
            self.config.records_per_task, self.config.num_epochs,
            self.config.max_task_retries,
            [(s.path, s.num_records) for s in eval_shards],
            seed=None if self.config.shuffle_seed < 0 else self.config.shuffle_seed,
        )
        if self.engine is None:
            log_dir = os.path.join(self.config.output, "logs") if self.config.output else ""
            self.engine = instance_manager.create(
                "local", log_dir=log_dir, on_line=self.console.role_line
            )
        try:
            server, port = rpc.create_server(
                [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(self), s)],
                self.config.host, self.config.port,
            )
            address = f"{self.config.host}:{port}"
            logger.info("Job %s: master at %s; %d training records in %d files, %d tasks/epoch",
                        self.config.job_name, address, self.tasks.records_per_epoch,
                        len(self._shards), self.tasks.tasks_per_epoch)
            self._launch(address)
            self._loop()
            self._training_ended_at = time.time()
            if not self.tasks.failed and not self._error and self.config.grads_to_wait:
                self._wait_for_rounds()
            if not self.tasks.failed and not self._error and self.config.output:
                self._export()
        except KeyboardInterrupt:
            self._error = "interrupted (Ctrl-C or SIGTERM)"
            logger.error("Job %s interrupted; stopping every role", self.config.job_name)
        except Exception as exc:
            self._error = self._error or f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._shutdown(server)
            summary = self._summary(started)
            if self.config.output:
                os.makedirs(self.config.output, exist_ok=True)
                summary.write(os.path.join(self.config.output, "job_summary.json"))
        return summary

    def _launch(self, address):
        """Starts every role, then waits for the parameter servers to register."""
        for ps_id in range(self.config.num_ps):
            args = to_argv(self.config.ps_config(ps_id, address))
            self.engine.start(RoleSpec(RoleType.PS, ps_id, "elastic_keras.ps", tuple(args)))
        for worker_id in range(self.config.num_workers):
            args = to_argv(self.config.worker_config(worker_id, address))
            self.engine.start(
                RoleSpec(RoleType.WORKER, worker_id, "elastic_keras.worker", tuple(args))
            )
        deadline = time.monotonic() + PS_REGISTRATION_TIMEOUT_S
        while not self.membership.ps_addresses()[0]:
            for exit_ in self.engine.poll():
                self._role_exits.append(exit_)
                raise RuntimeError(
                    f"{exit_.spec.name} exited with code {exit_.exit_code} before registering; "
                    "see its log above"
                )
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"parameter servers did not register within {PS_REGISTRATION_TIMEOUT_S:.0f} s"
                )
            time.sleep(0.05)

    def _loop(self):
        while True:
            for exit_ in self.engine.poll():
                self._on_role_exit(exit_)
            if self._error:
                return
            epoch = self.tasks.epoch_finished()
            if epoch is not None:
                logger.info("Epoch %d trained (model version %d)", epoch + 1, self.model_version)
                if not self.tasks.start_evaluation(self.model_version):
                    self.tasks.next_epoch()
            finished_round = self.tasks.evaluation_finished()
            if finished_round is not None:
                self._close_evaluation(*finished_round)
                self.tasks.next_epoch()
            if self.tasks.finished:
                if self.tasks.failed:
                    self._error = self.tasks.error
                return
            self._show_progress()
            time.sleep(_TICK_S)

    def _on_role_exit(self, exit_):
        if self.no_more_tasks and exit_.succeeded:
            return
        self._role_exits.append(exit_)
        name = exit_.spec.name
        if exit_.spec.type == RoleType.PS:
            self._error = f"{name} exited with code {exit_.exit_code}; see its log"
            return
        lost = self.tasks.recover_worker(exit_.spec.index)
        logger.warning("%s exited with code %d; %d of its tasks re-queued", name,
                       exit_.exit_code, lost)
        if not any(s.type == RoleType.WORKER for s in self.engine.running()):
            self._error = (
                f"every worker has exited; the last, {name}, with code {exit_.exit_code}"
            )

    def _close_evaluation(self, epoch, model_version):
        metrics = self._eval_sums.results(self.spec.eval_metrics_fn)
        self._eval_sums = MetricSums()
        self._evaluations.append(
            {"epoch": epoch + 1, "model_version": model_version, "metrics": metrics}
        )
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in metrics.items())
        logger.info("Evaluation after epoch %d (model version %d): %s", epoch + 1,
                    model_version, shown)

    def _show_progress(self):
        epoch, done, total = self.tasks.progress()
        loss = self.throughput.loss
        self.console.status(
            f"epoch {epoch + 1}/{self.config.num_epochs}  records {done}/{total}  "
            f"loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"{self.throughput.examples_per_second():.0f} examples/s  "
            f"version {self.model_version}"
        )

    def _wait_for_rounds(self):
        """Synchronous training: waits until every shard has applied its last round."""
        since = time.monotonic()
        deadline = since + self.config.sync_round_timeout_s + 10.0
        while not self.membership.rounds_closed_since(since):
            if time.monotonic() > deadline:
                logger.warning("Parameter servers did not report their last round applied.")
                return
            time.sleep(_TICK_S)

    def _export(self):
        _, addresses = self.membership.ps_addresses()
        client = PSClient(addresses)
        try:
            features = sample_features(self.spec, self._shards[0].path,
                                       self.config.index_cache_dir)
            path = os.path.join(self.config.output, "saved_model")
            export_saved_model(self.spec, client, features, path,
                               self.config.embedding_threshold_params)
        finally:
            client.close()

    def _shutdown(self, server):
        """Lets roles exit on their own after a good end (workers when told there are no
        more tasks, PS at their next heartbeat), then stops whatever is left."""
        self.no_more_tasks = True
        if not self._error and not (self.tasks and self.tasks.failed):
            self._wait_for_exits(RoleType.WORKER, ROLE_EXIT_GRACE_S)
        self.job_finished = True
        if not self._error and not (self.tasks and self.tasks.failed):
            self._wait_for_exits(RoleType.PS, ROLE_EXIT_GRACE_S)
        self.engine.stop_all(STOP_GRACE_S)
        for exit_ in self.engine.poll():
            if not exit_.succeeded:
                self._role_exits.append(exit_)
        if server is not None:
            server.stop(grace=1.0)
        self.console.close()

    def _wait_for_exits(self, role_type, timeout_s):
        deadline = time.monotonic() + timeout_s
        while any(r.type == role_type for r in self.engine.running()):
            if time.monotonic() > deadline:
                return
            for exit_ in self.engine.poll():
                if not exit_.succeeded:
                    self._role_exits.append(exit_)
            time.sleep(_TICK_S)

    def _summary(self, started):
        now = time.time()
        train_started = self._first_task_at
        failed = bool(self._error) or self.tasks is None or self.tasks.failed
        epochs = []
        if self.tasks is not None:
            for counts in self.tasks.epoch_counts():
                epochs.append({
                    "epoch": counts.epoch + 1,
                    "records": counts.total,
                    "trained_at_least_once": counts.trained_at_least_once,
                    "trained_more_than_once": counts.trained_more_than_once,
                    "trained_never": counts.total - counts.trained_at_least_once,
                })
            if not failed and any(e["trained_never"] for e in epochs):
                failed = True
                self._error = "some records were never trained"
        ended = self._training_ended_at or now
        training_time = ended - train_started if train_started else 0.0
        trained = self.throughput.records
        return JobSummary(
            job_name=self.config.job_name,
            status=JobStatus.FAILED if failed else JobStatus.SUCCEEDED,
            error=self._error or (self.tasks.error if self.tasks else ""),
            num_workers=self.config.num_workers,
            num_ps=self.config.num_ps,
            epochs=epochs,
            tasks_done=self.tasks.tasks_done if self.tasks else 0,
            tasks_failed=self.tasks.tasks_failed if self.tasks else 0,
            tasks_requeued=self.tasks.tasks_requeued if self.tasks else 0,
            final_model_version=self.model_version,
            wall_time_s=round(now - started, 3),
            training_time_s=round(training_time, 3),
            examples_trained=trained,
            examples_per_second=round(trained / training_time, 1) if training_time else 0.0,
            evaluations=self._evaluations,
            staleness=self.membership.staleness(),
            role_exits=[{"role": e.spec.name, "exit_code": e.exit_code}
                        for e in self._role_exits],
            saved_model=(os.path.join(self.config.output, "saved_model")
                         if self.config.output and not failed else ""),
        )
