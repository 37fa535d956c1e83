"""The master: one readable loop that runs a job from launch to summary.

It lists the data, starts the parameter servers and workers through an `InstanceManager`,
hands out tasks, watches the roles, evaluates, checkpoints, exports the model and writes
`job_summary.json`. Mechanism lives elsewhere (task manager, engines, checkpoints, servicer);
this file holds the policy:

- A worker that exits before the end (killed, crashed, preempted) has its tasks re-queued
  from their last reported record and is relaunched up to `--relaunch-on-worker-failure`
  times; past that the job carries on with the workers it has, and fails only when none is
  left. A worker silent for `--worker-heartbeat-timeout` seconds, or holding a task past the
  adaptive task timeout, is killed and handled the same way.
- A parameter server that exits is relaunched at the same address (workers reconnect on
  their own and retry through the gap) up to `--relaunch-on-ps-failure` times, restoring
  its shard from the latest complete checkpoint.
- `elastic-keras scale` changes the number of workers: new ones get new ids; removed ones
  (the highest ids) get SIGTERM, hand their task back and exit.
- With `--checkpoint-dir`, a checkpoint (every shard plus the job state) is taken every
  `--checkpoint-steps` versions and at the end; the same command run again resumes the job.
"""

import collections
import logging
import os
import threading
import time

from elastic_keras.common import rpc
from elastic_keras.common.config import to_argv
from elastic_keras.common.errors import ConfigError, ModelSpecError, PayloadError
from elastic_keras.common.metrics import MetricSums
from elastic_keras.common.ps_client import PSClient
from elastic_keras.data.shards import list_shards
from elastic_keras.master import instance_manager, job_locator
from elastic_keras.master.checkpoints import JobCheckpoints, init_checkpoint
from elastic_keras.master.console import Console
from elastic_keras.master.export import export_saved_model, sample_features
from elastic_keras.master.instance_manager import RoleSpec, RoleType
from elastic_keras.master.membership import Membership
from elastic_keras.master.push_account import PushAccount
from elastic_keras.master.servicer import MasterServicer
from elastic_keras.master.summary import JobStatus, JobSummary
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.tasks import TaskOutcome, TaskType
from elastic_keras.master.tensorboard import EventWriter
from elastic_keras.master.throughput import Throughput
from elastic_keras.proto import master_pb2_grpc

logger = logging.getLogger(__name__)

PS_REGISTRATION_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
ROLE_EXIT_GRACE_S = 10.0  # after a good end, how long roles get to exit on their own
WORKER_LEAVE_GRACE_S = 30.0  # a worker scaled away gets this long to hand its task back
EVENTS_EVERY_S = 5.0  # how often training scalars go to the TensorBoard event file
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
        self.pushes = PushAccount()
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
        self.checkpoints = JobCheckpoints(config.checkpoint_dir, config.checkpoint_steps,
                                          config.keep_checkpoint_max, config.job_name)
        self._restore_from = ""      # the checkpoint the parameter servers start from
        self._resumed_from = ""
        self._examples_before = 0    # trained by earlier runs of a resumed job
        self._earlier_role_exits = []  # role exits of earlier runs of a resumed job
        self._address = ""
        self._ps_client = None
        self._relaunches = collections.Counter()  # role name -> relaunches so far
        self._scale_lock = threading.Lock()
        self._target_workers = config.num_workers   # what `elastic-keras scale` asked for
        self._applied_workers = config.num_workers  # what the loop has acted on
        self._next_worker_id = config.num_workers
        self._leaving = set()        # ids of workers stopped by scaling down
        self._next_eval_version = config.evaluation_steps
        self._eval_versions = []     # versions the evaluation tasks of the open round used
        self._events = None
        self._events_at = 0.0

    # -- called by the servicer --------------------------------------------------------------

    def get_task(self, worker_id):
        if self.tasks is None or self.no_more_tasks:
            return None
        task = self.tasks.get(worker_id)
        if task is not None and self._first_task_at is None:
            self._first_task_at = time.time()
        if task is not None and task.takes_over:
            logger.info("Worker %d takes over %s records [%d, %d) of %s (task %d)", worker_id,
                        task.type.value, task.start, task.end, os.path.basename(task.path),
                        task.task_id)
        return task

    def report_progress(self, worker_id, task_id, records_done, loss, model_version,
                        minibatches=0):
        self._note_version(model_version)
        if minibatches:
            self.pushes.report(task_id, worker_id, minibatches)
        before = self._records_of(task_id)
        self.tasks.report_progress(task_id, records_done)
        self.throughput.add(max(0, self._records_of(task_id) - before), loss)

    def report_task_result(self, worker_id, task_id, records_done, error, loss,
                           model_version, metric_states, abandoned=False, minibatches=0,
                           dropped=None):
        self._note_version(model_version)
        if minibatches or dropped:
            self.pushes.report(task_id, worker_id, minibatches, dropped)
        before = self._records_of(task_id)
        task, outcome = self.tasks.report_result(task_id, records_done, error, abandoned)
        if task is None:
            return
        if task.type == TaskType.TRAINING:
            trained = records_done if error or abandoned else task.num_records
            self.throughput.add(max(0, trained - before), None if error else loss)
        elif outcome == TaskOutcome.DONE:
            try:
                self._eval_sums.add(metric_states)
            except (PayloadError, ModelSpecError) as exc:  # none of the task's states added
                logger.error("Worker %d sent evaluation metrics that cannot be merged: %s",
                             worker_id, exc)
            self._eval_versions.append(model_version)
        if abandoned:
            logger.info("Worker %d handed back %s task %d after %d records", worker_id,
                        task.type.value, task_id, records_done)
        elif error:
            logger.warning("Worker %d failed %s task %d (%s): %s", worker_id,
                           task.type.value, task_id, outcome, error)

    def _records_of(self, task_id):
        return self.tasks.records_done(task_id)

    def _note_version(self, version):
        with self._versions_lock:
            self._model_version = max(self._model_version, version)

    @property
    def sync_round_size(self):
        """Pushes that close a synchronous round now (see `HeartbeatResponse`): at most
        `--grads-to-wait`, and no more than the workers alive (started, not leaving) that
        have training work, running or waiting to be handed out."""
        if self.tasks is None or self.engine is None:
            return self.config.grads_to_wait
        waiting, running = self.tasks.training_load()
        alive = sum(s.type == RoleType.WORKER and s.index not in self._leaving
                    for s in self.engine.running())
        return min(self.config.grads_to_wait, alive, running + waiting)

    @property
    def model_version(self):
        with self._versions_lock:
            return max(self._model_version, self.membership.model_version)

    def scale(self, num_workers):
        """Sets the number of workers from now on; returns (previous target, running)."""
        with self._scale_lock:
            previous, self._target_workers = self._target_workers, num_workers
        running = sum(s.type == RoleType.WORKER for s in self.engine.running())
        logger.info("Scale request: %d -> %d workers", previous, num_workers)
        return previous, running

    # -- the job -------------------------------------------------------------------------------

    def run(self):
        """Runs the job to its end and returns its `JobSummary` (also written to --output)."""
        started = time.time()
        server = None
        # Bad data, or a checkpoint directory of another job, ends the job here, before
        # anything is launched or written.
        self._shards = list_shards(self.config.training_data, self.config.index_cache_dir)
        eval_shards = (
            list_shards(self.config.validation_data, self.config.index_cache_dir,
                        flag="--validation-data")
            if self.config.validation_data else []
        )
        self.tasks = self._task_manager(
            [(s.path, s.num_records) for s in self._shards],
            [(s.path, s.num_records) for s in eval_shards],
        )
        if self.engine is None:
            log_dir = os.path.join(self.config.output, "logs") if self.config.output else ""
            self.engine = instance_manager.create(
                "local", log_dir=log_dir, on_line=self.console.role_line
            )
        if self.config.output:
            self._events = EventWriter(os.path.join(self.config.output, "tensorboard"))
        try:
            server, port = rpc.create_server(
                [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(self), s)],
                self.config.host, self.config.port,
            )
            self._address = f"{self.config.host}:{port}"
            job_locator.register(self.config.job_name, self._address)
            logger.info("Job %s: master at %s; %d training records in %d files, %d tasks/epoch",
                        self.config.job_name, self._address, self.tasks.records_per_epoch,
                        len(self._shards), self.tasks.tasks_per_epoch)
            if self._launch():
                self._loop()
            self._training_ended_at = time.time()
            if not self.tasks.failed and not self._error:
                self._wait_for_shard_reports()
            if not self.tasks.failed and not self._error and self.checkpoints.enabled:
                self._checkpoint(finished=True)
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
            job_locator.unregister(self.config.job_name)
            summary = self._summary(started)
            if self.config.output:
                os.makedirs(self.config.output, exist_ok=True)
                summary.write(os.path.join(self.config.output, "job_summary.json"))
            if self._events:
                self._events.close()
        return summary

    def _task_manager(self, shards, eval_shards):
        """A fresh task manager, or the one of the checkpoint this job resumes from."""
        config = self.config
        seed = None if config.shuffle_seed < 0 else config.shuffle_seed
        resumable = self.checkpoints.find_resumable()
        if resumable is None:
            if config.checkpoint_dir_for_init:
                self._restore_from = init_checkpoint(config.checkpoint_dir_for_init)
                logger.info("The model starts from %s", self._restore_from)
            return TaskManager(shards, config.records_per_task, config.num_epochs,
                               config.max_task_retries, eval_shards, seed=seed)
        path, state = resumable
        try:
            tasks = TaskManager.from_state(state["tasks"], shards, config.records_per_task,
                                           config.num_epochs, config.max_task_retries,
                                           eval_shards, seed=seed)
        except ValueError as exc:
            raise ConfigError(
                f"Cannot resume job {config.job_name!r} from {path}: {exc}"
            ) from exc
        self._restore_from = self._resumed_from = path
        self._evaluations = list(state.get("evaluations", []))
        self._examples_before = int(state.get("examples_trained", 0))
        self._model_version = int(state.get("model_version", 0))
        self._relaunches.update(state.get("relaunches", {}))
        self._earlier_role_exits = list(state.get("role_exits", []))
        if config.evaluation_steps:
            self._next_eval_version = self._model_version + config.evaluation_steps
        logger.info("Resuming job %s from %s (model version %d, epoch %d of %d)",
                    config.job_name, path, self._model_version,
                    min(tasks.epoch, config.num_epochs - 1) + 1, config.num_epochs)
        return tasks

    # -- roles -----------------------------------------------------------------------------

    def _start_ps(self, ps_id, port=0, restore_from="", min_version=0):
        args = to_argv(self.config.ps_config(ps_id, self._address, port, restore_from,
                                             min_version))
        self.engine.start(RoleSpec(RoleType.PS, ps_id, "elastic_keras.ps", tuple(args)))

    def _start_worker(self, worker_id):
        args = to_argv(self.config.worker_config(worker_id, self._address))
        self.engine.start(
            RoleSpec(RoleType.WORKER, worker_id, "elastic_keras.worker", tuple(args))
        )

    def _launch(self):
        """Starts every role, then waits for the parameter servers to register; returns
        whether the job can go on (if not, `_error` says why).

        A role that exits meanwhile (killed, or its machine lost) is handled as during
        training: relaunched within its budget. Workers learn the shards' addresses only
        once all have registered, so a shard relaunched before that may take a new port.
        """
        for ps_id in range(self.config.num_ps):
            self._start_ps(ps_id, restore_from=self._restore_from)
        for worker_id in range(self.config.num_workers):
            self._start_worker(worker_id)
        deadline = time.monotonic() + PS_REGISTRATION_TIMEOUT_S
        while not self.membership.ps_addresses()[0]:
            for exit_ in self.engine.poll():
                self._on_role_exit(exit_)
            if self._error:
                return False
            if time.monotonic() > deadline:
                self._error = (f"the parameter servers did not all register within "
                               f"{PS_REGISTRATION_TIMEOUT_S:.0f} s; see their logs")
                return False
            time.sleep(0.05)
        self._ps_client = PSClient(self.membership.ps_addresses()[1])
        return True

    def _loop(self):
        while True:
            for exit_ in self.engine.poll():
                self._on_role_exit(exit_)
            if self._error:
                return
            self._apply_scale()
            self._stop_unresponsive_roles()
            epoch = self.tasks.epoch_finished()
            if epoch is not None:
                logger.info("Epoch %d trained (model version %d)", epoch + 1, self.model_version)
                if not self.tasks.start_evaluation(self.model_version):
                    self.tasks.next_epoch()
            elif (self.config.evaluation_steps
                  and self.model_version >= self._next_eval_version
                  and self.tasks.start_evaluation(self.model_version, end_of_epoch=False)):
                self._next_eval_version = self.model_version + self.config.evaluation_steps
            finished_round = self.tasks.evaluation_finished()
            if finished_round is not None:
                self._close_evaluation(finished_round)
                if finished_round.end_of_epoch:
                    self.tasks.next_epoch()
            if self.tasks.finished:
                if self.tasks.failed:
                    self._error = self.tasks.error
                return
            if self.checkpoints.due(self.model_version):
                self._checkpoint()
            self._show_progress()
            time.sleep(_TICK_S)

    def _on_role_exit(self, exit_):
        spec = exit_.spec
        if spec.type == RoleType.WORKER and spec.index in self._leaving:
            self._leaving.discard(spec.index)
            self.membership.forget_worker(spec.index)
            lost = self.tasks.recover_worker(spec.index)
            logger.info("%s left the job (exit code %d)%s", spec.name, exit_.exit_code,
                        f"; {lost} of its tasks re-queued" if lost else "")
            return
        if self.no_more_tasks and exit_.succeeded:
            return
        self._role_exits.append(exit_)
        if spec.type == RoleType.PS:
            self._on_ps_exit(exit_)
        else:
            self._on_worker_exit(exit_)

    def _on_worker_exit(self, exit_):
        spec = exit_.spec
        self.membership.forget_worker(spec.index)
        lost = self.tasks.recover_worker(spec.index)
        how = ("left without being asked (preempted?)" if exit_.succeeded
               else f"exited with code {exit_.exit_code}")
        budget = self.config.relaunch_on_worker_failure
        if self._relaunches[spec.name] < budget:
            self._relaunches[spec.name] += 1
            self._start_worker(spec.index)
            logger.warning("%s %s; %d of its tasks re-queued; relaunched it (%d of %d)",
                           spec.name, how, lost, self._relaunches[spec.name], budget)
        else:
            logger.warning("%s %s; %d of its tasks re-queued; not relaunched: it has been "
                           "relaunched %d times (--relaunch-on-worker-failure)", spec.name,
                           how, lost, budget)
        if not any(s.type == RoleType.WORKER for s in self.engine.running()):
            self._error = (
                f"every worker has exited; the last, {spec.name}, with code {exit_.exit_code}"
            )

    def _on_ps_exit(self, exit_):
        spec = exit_.spec
        self.membership.mark_ps_down(spec.index)
        budget = self.config.relaunch_on_ps_failure
        if self._relaunches[spec.name] >= budget:
            self._error = (f"{spec.name} exited with code {exit_.exit_code} and has been "
                           f"relaunched {budget} times (--relaunch-on-ps-failure); see its log")
            return
        self._relaunches[spec.name] += 1
        _, addresses = self.membership.ps_addresses()
        port = int(addresses[spec.index].rsplit(":", 1)[1]) if addresses else 0
        restore = self.checkpoints.latest() or self._restore_from
        # Its version goes on from the highest it reported, not back to the checkpoint's.
        self._start_ps(spec.index, port, restore, self.membership.ps_version(spec.index))
        logger.warning(
            "%s exited with code %d; relaunched it (%d of %d) %s, %s. Workers wait for it.",
            spec.name, exit_.exit_code, self._relaunches[spec.name], budget,
            "at the same address" if port else "before every shard had registered",
            f"restoring {restore}" if restore else
            "with no checkpoint to restore: workers re-initialise its dense variables from "
            "their copies, and its embedding rows start again from their initial values",
        )

    def _apply_scale(self):
        """Acts on an `elastic-keras scale` request: starts or stops workers."""
        with self._scale_lock:
            target = self._target_workers
        change, self._applied_workers = target - self._applied_workers, target
        if change > 0 and not self.no_more_tasks:
            for _ in range(change):
                worker_id, self._next_worker_id = self._next_worker_id, self._next_worker_id + 1
                self._start_worker(worker_id)
                logger.info("Scaled up: started worker-%d", worker_id)
        elif change < 0:
            active = sorted(s.index for s in self.engine.running()
                            if s.type == RoleType.WORKER and s.index not in self._leaving)
            for worker_id in active[len(active) + change:] if len(active) > 1 else ():
                self._leaving.add(worker_id)
                threading.Thread(
                    target=self.engine.stop, args=(f"worker-{worker_id}", WORKER_LEAVE_GRACE_S),
                    name=f"stop-worker-{worker_id}", daemon=True,
                ).start()
                logger.info("Scaled down: asked worker-%d to hand its task back and leave",
                            worker_id)

    def _stop_unresponsive_roles(self):
        """Kills workers and parameter servers that stopped heartbeating, and workers that
        hold a task past its timeout; their exits are then handled like any other (tasks
        re-queued, the role relaunched)."""
        for role, timeout, forget in (
                ("ps", self.config.ps_heartbeat_timeout, self.membership.mark_ps_down),
                ("worker", self.config.worker_heartbeat_timeout,
                 self.membership.forget_worker)):
            for index in self.membership.silent(role, timeout) if timeout else ():
                forget(index)
                logger.warning("%s-%d sent no heartbeat for %.0f s (--%s-heartbeat-timeout); "
                               "killing it", role, index, timeout, role)
                self.engine.kill(f"{role}-{index}")
        for task_id, worker_id, held_s in self.tasks.overdue(self.config.task_timeout_floor):
            self.tasks.requeue_overdue(task_id)
            logger.warning("worker-%d has held task %d for %.0f s, past the task timeout; "
                           "re-queued the task and killing the worker", worker_id, task_id,
                           held_s)
            self.engine.kill(f"worker-{worker_id}")

    # -- checkpoints, evaluation, progress --------------------------------------------------

    def _job_state(self, finished=False):
        return {
            "tasks": self.tasks.state(),
            "evaluations": list(self._evaluations),
            "examples_trained": self._examples_before + self.throughput.records,
            "model_version": self.model_version,
            "finished": finished,
            "relaunches": dict(self._relaunches),
            "role_exits": self._earlier_role_exits + [
                {"role": e.spec.name, "exit_code": e.exit_code} for e in self._role_exits],
        }

    def _checkpoint(self, finished=False):
        """Snapshots the job state, then has every shard save (see `master/checkpoints`)."""
        # Only a worker on a training task may have a push in flight: a task ends after its
        # pushes have landed.
        self.checkpoints.save(self._ps_client, self._job_state(finished),
                              self.tasks.training_workers())

    def _close_evaluation(self, finished_round):
        try:
            metrics = self._eval_sums.results(self.spec.eval_metrics_fn)
        except (PayloadError, ModelSpecError) as exc:
            logger.error("The evaluation's metrics cannot be computed: %s", exc)
            metrics = {}
        self._eval_sums = MetricSums()
        # Workers report the version they evaluated; with training paused it is one version.
        version = max(self._eval_versions, default=finished_round.model_version)
        self._eval_versions = []
        if self.config.evaluation_steps:  # the next round comes that many versions later
            self._next_eval_version = max(self._next_eval_version,
                                          version + self.config.evaluation_steps)
        epoch = finished_round.epoch
        self._evaluations.append({"epoch": epoch + 1, "model_version": version,
                                  "end_of_epoch": finished_round.end_of_epoch,
                                  "metrics": metrics})
        shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}"
                          for k, v in metrics.items())
        when = "after epoch" if finished_round.end_of_epoch else "during epoch"
        logger.info("Evaluation %s %d (model version %d): %s", when, epoch + 1, version, shown)
        if self._events:
            self._events.scalars({f"eval/{k}": v for k, v in metrics.items()
                                  if isinstance(v, (int, float))}, version)
            self._events.flush()

    def _show_progress(self):
        epoch, done, total = self.tasks.progress()
        loss = self.throughput.loss
        examples_per_second = self.throughput.examples_per_second()
        self.console.status(
            f"epoch {epoch + 1}/{self.config.num_epochs}  records {done}/{total}  "
            f"loss {'-' if loss is None else f'{loss:.4f}'}  "
            f"{examples_per_second:.0f} examples/s  version {self.model_version}"
        )
        now = time.monotonic()
        if self._events and loss is not None and now - self._events_at >= EVENTS_EVERY_S:
            self._events_at = now
            self._events.scalars({"train/loss": loss,
                                  "train/examples_per_second": examples_per_second},
                                 self.model_version)

    def _wait_for_shard_reports(self):
        """Waits until every shard has reported after training ended, with no open
        synchronous round: its version and applied pushes are then final."""
        since = time.monotonic()
        deadline = since + self.config.sync_round_timeout_s + 10.0
        while not self.membership.rounds_closed_since(since):
            if time.monotonic() > deadline:
                logger.warning("Parameter servers did not report their last updates applied.")
                return
            time.sleep(_TICK_S)

    def _export(self):
        features = sample_features(self.spec, self._shards[0].path, self.config.index_cache_dir)
        path = os.path.join(self.config.output, "saved_model")
        export_saved_model(self.spec, self._ps_client, features, path,
                           self.config.embedding_threshold_params)

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
        if self._ps_client is not None:
            self._ps_client.close()
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

    def _duplicates_bound(self):
        """Records a lost task attempt may have trained that its next attempt trains again.

        The attempt is retrained from its worker's last progress report: at most a reporting
        interval of landed minibatches lies past it, plus the one whose push was in flight
        (it may land after its worker died).
        """
        return (self.config.progress_report_minibatches + 1) * self.config.minibatch_size

    def _summary(self, started):
        now = time.time()
        train_started = self._first_task_at
        failed = bool(self._error) or self.tasks is None or self.tasks.failed
        epochs = []
        bound = self._duplicates_bound()
        if self.tasks is not None:
            for counts in self.tasks.epoch_counts():
                epochs.append({
                    "epoch": counts.epoch + 1,
                    "records": counts.total,
                    "trained_at_least_once": counts.trained_at_least_once,
                    "trained_more_than_once": counts.trained_more_than_once,
                    # Records trained past a lost task's last report are trained again
                    # unseen: at most `bound` per lost task.
                    "tasks_lost": counts.tasks_lost,
                    "trained_more_than_once_at_most": (counts.trained_more_than_once
                                                       + counts.tasks_lost * bound),
                    "trained_never": counts.total - counts.trained_at_least_once,
                    "training_s": counts.training_s,
                })
            if not failed and any(e["trained_never"] for e in epochs):
                failed = True
                self._error = "some records were never trained"
        ended = self._training_ended_at or now
        training_time = ended - train_started if train_started else 0.0
        trained = self.throughput.records  # in this run; earlier runs of a resumed job add theirs
        with self._scale_lock:
            num_workers = self._target_workers
        return JobSummary(
            job_name=self.config.job_name,
            status=JobStatus.FAILED if failed else JobStatus.SUCCEEDED,
            error=self._error or (self.tasks.error if self.tasks else ""),
            num_workers=num_workers,
            num_ps=self.config.num_ps,
            epochs=epochs,
            tasks_done=self.tasks.tasks_done if self.tasks else 0,
            tasks_failed=self.tasks.tasks_failed if self.tasks else 0,
            tasks_requeued=self.tasks.tasks_requeued if self.tasks else 0,
            final_model_version=self.model_version,
            wall_time_s=round(now - started, 3),
            training_time_s=round(training_time, 3),
            examples_trained=self._examples_before + trained,
            examples_per_second=round(trained / training_time, 1) if training_time else 0.0,
            evaluations=self._evaluations,
            staleness=self.membership.staleness(),
            role_exits=self._earlier_role_exits + [
                {"role": e.spec.name, "exit_code": e.exit_code} for e in self._role_exits],
            saved_model=(os.path.join(self.config.output, "saved_model")
                         if self.config.output and not failed else ""),
            recovery={
                "resumed_from": self._resumed_from,
                "relaunches": dict(sorted(self._relaunches.items())),
                "tasks_handed_back": self.tasks.tasks_handed_back if self.tasks else 0,
                "tasks_timed_out": self.tasks.tasks_timed_out if self.tasks else 0,
                "checkpoints_written": self.checkpoints.written,
                "last_checkpoint": self.checkpoints.last_path,
                "duplicates_bound_per_lost_task": bound,
            },
            pushes={"by_worker": self.pushes.by_worker(),
                    "applied_by_shard": self.membership.applied_pushes()},
        )
