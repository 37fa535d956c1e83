"""The master: one readable loop that runs a job from launch to summary.

It lists the data, starts the roles through its engine, hands out tasks, watches the roles,
evaluates, checkpoints, exports the model and writes `job_summary.json`. Mechanism lives
elsewhere (`roles`, the engines, the task queue, `reports`, `checkpoints`, ...); this file
holds the policy:

- A role that exits before the end is relaunched, its tasks re-queued, or the job given up
  (`relaunch`). A worker silent for `--worker-heartbeat-timeout` seconds, or holding a task
  past the adaptive task timeout, is killed and handled the same way.
- `elastic-keras scale` changes the number of workers (`scaling`).
- The module's callbacks run at epochs (`callbacks`); one may end the job early.
- With `--checkpoint-dir`, a checkpoint (every shard plus the `JobState`) is taken every
  `--checkpoint-steps` versions and at the end; the same command run again resumes the job.
- Evaluate and predict run one round over their data on the restored model (an ensemble:
  `--num-ps` shards per member, in slots member x num-ps + shard); export runs no workers.
  What each job type leaves behind is `outputs`'.
"""

import logging
from functools import partial
import os
import time

from elastic_keras.common import auth, rpc
from elastic_keras.common.master_client import HEARTBEAT_INTERVAL_S
from elastic_keras.common.ps_client import PSClient
from elastic_keras.master import instance_manager, job_locator
from elastic_keras.master.callbacks import CallbackError, JobCallbacks
from elastic_keras.master.checkpoints import JobCheckpoints
from elastic_keras.master.console import Console
from elastic_keras.master.evaluation import Evaluations
from elastic_keras.master.instance_manager import RoleType
from elastic_keras.master.job_state import JobState
from elastic_keras.master.job_tls import JobTls
from elastic_keras.master.membership import Membership
from elastic_keras.master.export import sample_features
from elastic_keras.master.outputs import JobOutputs
from elastic_keras.master.relaunch import RoleExitPolicy
from elastic_keras.master.reports import Reports
from elastic_keras.master.resume import start_job
from elastic_keras.master.roles import Roles
from elastic_keras.master.scaling import Scaling
from elastic_keras.master.servicer import AUTHORITY, MasterServicer
from elastic_keras.master.status_server import start_status_page
from elastic_keras.master.status_view import StatusView
from elastic_keras.master.summary import INTERRUPTED, RunFacts, build_summary
from elastic_keras.master.tensorboard import EventWriter
from elastic_keras.master.watchdog import watch
from elastic_keras.proto import master_pb2_grpc

logger = logging.getLogger(__name__)

PS_REGISTRATION_TIMEOUT_S = 180.0
STOP_GRACE_S = 15.0
ROLE_EXIT_GRACE_S = 10.0  # after a good end, how long roles get to exit on their own
CHECKPOINT_SILENCE_S = 3 * HEARTBEAT_INTERVAL_S  # a checkpoint waits for silent shards
_TICK_S = 0.2


class Master:
    """Runs one job described by `config` with the checked model module `spec`.

    Args:
        config: the job's `JobConfig`.
        spec: the loaded and checked `ModelSpec`.
        engine: the `InstanceManager` that runs roles (default: `--engine`'s, made once the
            data checks out).
        console: where progress and role lines go (default: stderr).
    """

    def __init__(self, config, spec, engine=None, console=None):
        self.config = config
        self.spec = spec
        self.console = console or Console(show_role_info=config.log_level == "debug")
        self._secret = auth.new_secret()  # this run's: every role's credential comes from it
        self._job_tls = None  # made when the job runs (`JobTls`)
        self.roles = Roles(config, engine, self._secret, self._role_tls) if engine else None
        self.membership = Membership(config.num_ps * config.ensemble_members)
        self.outputs = JobOutputs(config, spec)
        self.callbacks = JobCallbacks(spec, config)
        self.evaluations = Evaluations(spec.eval_metrics_fn, config.evaluation_steps)
        self.reports = Reports(self.membership, self.evaluations)
        self.reports.paused = bool(self.callbacks)  # until the first epoch has begun
        self.checkpoints = JobCheckpoints(config.checkpoint_dir, config.checkpoint_steps,
                                          config.keep_checkpoint_max, config.job_name)
        self.job_finished = False    # tells roles to exit
        self._earlier = JobState(config.job_name, tasks={})  # earlier runs of a resumed job
        self.role_exits = RoleExitPolicy(self)  # relaunch, re-queue, give up
        self._error = ""
        self.members, self._resumed_from = [""], ""  # each model's checkpoint; resumed one
        self._ps_client = None   # the master's own calls to the shards
        self.scaling = Scaling(config.num_workers)
        self._training_ended_at = None
        self._sample_file = ""  # a data file, for the SavedModel's input signature
        self.stopped_early = None  # the epoch after which a callback stopped the job
        self._epoch_ended = False  # its callbacks and the next epoch are due
        self._callbacks_waiting_since = None  # for shards to answer
        self.status = StatusView(self)  # what the status page shows
        self._status_page = None

    tasks = property(lambda self: self.reports.tasks)
    model_version = property(lambda self: self.reports.model_version)

    @property
    def sync_round_size(self):
        """Pushes that close a synchronous round now (`HeartbeatResponse`): at most
        `--grads-to-wait` and the workers alive with training work running or waiting."""
        if self.tasks is None or self.roles is None:
            return self.config.grads_to_wait
        waiting, running = self.tasks.training_load()
        return min(self.config.grads_to_wait, len(self.roles.workers()), running + waiting)

    def is_current(self, identity):  # worker `identity` is the launch of it that runs now
        return self.roles is not None and self.roles.is_current(identity)

    def _role_tls(self, name):
        return self._job_tls.for_role(name) if self._job_tls else None

    def _token(self, role):
        return auth.credential(self._secret, self.config.job_name, auth.Identity(role))

    def scale(self, num_workers):
        """Sets the number of workers from now on; returns (previous target, running)."""
        return self.scaling.request(num_workers, self.roles)

    # -- the job -------------------------------------------------------------------------------

    def run(self):
        """Runs the job to its end and returns its `JobSummary` (also written to --output)."""
        started = time.time()
        server = None
        self._job_tls = JobTls(self.config)  # bad TLS files or data: nothing launched
        self._start(start_job(self.config, self.checkpoints))
        if self.roles is None:
            self.roles = Roles(self.config, instance_manager.create(
                self.config.engine, self.config, on_line=self.console.role_line),
                self._secret, self._role_tls)
        if self.config.output or self.callbacks.log_dir:
            self.evaluations.events = EventWriter(
                self.callbacks.log_dir or os.path.join(self.config.output, "tensorboard"))
        try:
            server = self._serve()
            if self._launch() and self.outputs.runs_workers:
                self._run_callbacks(lambda: self.callbacks.begin(self._ps_client, partial(
                    sample_features, self.spec, self._sample_file,
                    self.config.index_cache_dir), self.tasks, self.reports))
                self._loop()
                if not self._error and not self.tasks.failed:
                    self._run_callbacks(lambda: self.callbacks.train_end({}))
            self._training_ended_at = time.time()
            self._finish()
        except KeyboardInterrupt:
            self._error = INTERRUPTED
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
            if self.evaluations.events:
                self.evaluations.events.close()
        return summary

    def _start(self, start):
        self.reports.tasks = start.tasks
        self._earlier = start.earlier
        self.role_exits.counts.update(start.earlier.relaunches)
        self.members, self._resumed_from = start.members, start.resumed_from
        self._sample_file = start.sample_file
        self.outputs.start(start, self.reports)
        if start.resumed_from:
            self.evaluations.resume(start.earlier.evaluations, start.earlier.model_version)
            self.reports.note_version(start.earlier.model_version)
            self.stopped_early = start.earlier.stopped_early

    def _serve(self):
        server, port = rpc.create_server(
            [lambda s: master_pb2_grpc.add_MasterServicer_to_server(MasterServicer(self), s)],
            self.config.host, self.config.port,
            auth=auth.ServerAuth(auth.Verifier(self._secret, self.config.job_name), AUTHORITY),
            tls=self._job_tls.own,
        )
        self.roles.master_address = rpc.advertised_address(self.config.host, port,
                                                           self.config.advertise_host)
        self._status_page = start_status_page(self.status, self.config)
        job_locator.register(self.config.job_name, self.roles.master_address,
                             credential=self._token(auth.Role.CLIENT),
                             tls=self._role_tls("client"),
                             status_url=getattr(self._status_page, "url", ""))
        logger.info("Job %s: master at %s", self.config.job_name, self.roles.master_address)
        return server

    def _launch(self):
        """Starts every role, then waits for the parameter servers to register; returns
        whether the job can go on (if not, `_error` says why). A role that exits meanwhile
        is handled as during training; workers learn the shards' addresses only once all
        have registered, so a shard relaunched before that may take a new port."""
        for slot in range(self.membership.num_ps):
            self.roles.start_ps(slot, restore_from=self.members[slot // self.config.num_ps])
        for worker_id in range(self.config.num_workers if self.outputs.runs_workers else 0):
            self.roles.start_worker(worker_id)
        deadline = time.monotonic() + PS_REGISTRATION_TIMEOUT_S
        while not self.membership.ps_addresses()[0]:
            self._handle_exits()
            if self._error:
                return False
            if time.monotonic() > deadline:
                self._error = (f"the parameter servers did not all register within "
                               f"{PS_REGISTRATION_TIMEOUT_S:.0f} s; see their logs")
                return False
            time.sleep(0.05)
        self._ps_client = PSClient(self.membership.ps_addresses()[1][:self.config.num_ps],
                                   token=self._token(auth.Role.MASTER), tls=self._job_tls.own)
        return True

    def _loop(self):
        tasks = self.tasks
        while True:
            self._handle_exits()
            self._error = self._error or self.outputs.error
            if self._error:
                return
            # A relaunched shard (of the first member: the others are the workers' only).
            self._ps_client.readdress(self.membership.ps_addresses()[1][:self.config.num_ps])
            self.scaling.apply(self.roles, self.reports.no_more_tasks)
            self._error = watch(self.config, self.membership, tasks, self.roles)
            self._epoch_ended = self._epoch_ended or self._rounds(tasks)
            self._close_epoch()
            if tasks.finished:
                self._error = tasks.error or self.outputs.error
                return
            # A hung shard would stall the checkpoint, and this loop with it: it waits.
            if (self.checkpoints.due(self.model_version)
                    and self.membership.shards_answering(CHECKPOINT_SILENCE_S)):
                self._checkpoint()
            self.reports.show(self.console, self.config, self.evaluations.events)
            self.status.sample()
            self.reports.drained.wait(_TICK_S)
            self.reports.drained.clear()

    # -- epochs and callbacks ----------------------------------------------------------------

    def _rounds(self, tasks):
        """Opens and closes evaluation rounds; returns whether the epoch has ended (trained,
        its closing round in): its callbacks and the next epoch are then due."""
        epoch = tasks.epoch_finished()
        if epoch is not None:
            if self.outputs.trains:
                logger.info("Epoch %d trained (model version %d)", epoch + 1,
                            self.model_version)
            if not tasks.start_evaluation(self.model_version):
                return True
        elif (self.evaluations.due(self.model_version)
              and tasks.start_evaluation(self.model_version, end_of_epoch=False)):
            self.evaluations.started(self.model_version)
        with self.reports.results_lock:  # no task ends between done and its outputs taken
            finished_round = tasks.evaluation_finished()
        if finished_round is None:
            return False
        self.outputs.round_closed(finished_round, self.evaluations)
        return finished_round.end_of_epoch

    def _close_epoch(self):
        """Runs an ended epoch's callbacks and begins the next. Callbacks may call the
        shards (a learning rate, a ModelCheckpoint): with any, a shard down is waited for
        until its replacement answers (at most `PS_REGISTRATION_TIMEOUT_S`: then the job
        fails), rather than failing the callback."""
        if not self._epoch_ended:
            return
        if self.callbacks and not self.membership.shards_answering(CHECKPOINT_SILENCE_S):
            if self._callbacks_waiting_since is None:
                self._callbacks_waiting_since = time.monotonic()
                logger.info("The epoch's callbacks wait for every parameter server to answer")
            elif time.monotonic() - self._callbacks_waiting_since > PS_REGISTRATION_TIMEOUT_S:
                self._error = (f"the parameter servers did not all answer within "
                               f"{PS_REGISTRATION_TIMEOUT_S:.0f} s for the epoch's callbacks; "
                               "see their logs")
            return
        self._epoch_ended, self._callbacks_waiting_since = False, None
        self._run_callbacks(self._next_epoch)

    def _run_callbacks(self, step):
        try:
            step()
        except CallbackError as exc:
            self._error = self._error or f"a callback failed: {exc}"

    def _next_epoch(self):
        self.stopped_early = self.callbacks.next_epoch(self.tasks, self.reports.throughput,
                                                       self.evaluations.results)

    def _handle_exits(self):
        for exit_ in self.roles.poll():
            self._error = self._error or self.role_exits.handle(exit_)

    # -- the end -------------------------------------------------------------------------------

    def _job_state(self, finished=False):
        exits = self.role_exits.exits + (self.roles.failed_exits if self.roles else [])
        return JobState(
            job_name=self.config.job_name,
            tasks=self.tasks.state() if self.tasks else {},
            model_version=self.model_version,
            examples_trained=self._earlier.examples_trained + self.reports.throughput.records,
            evaluations=list(self.evaluations.results),
            relaunches=dict(self.role_exits.counts),
            role_exits=self._earlier.role_exits + [e.to_json() for e in exits],
            finished=finished,
            stopped_early=self.stopped_early,
        )

    def _checkpoint(self, finished=False):
        """Snapshots the job state, then has every shard save (see `master/checkpoints`);
        only workers on a training task may have a push in flight."""
        self.checkpoints.save(self._ps_client, self._job_state(finished),
                              self.tasks.training_workers())

    def _finish(self):
        """After a good end of training: final versions, checkpoint and SavedModel."""
        if self.tasks.failed or self._error:
            return
        if self.outputs.trains and not self.membership.wait_for_rounds_closed(
                self.config.sync_round_timeout_s + 10):
            logger.warning("Parameter servers did not report their last updates applied.")
        if self.checkpoints.enabled:
            self._checkpoint(finished=True)
        self._error = self.outputs.finish(self._ps_client, self.evaluations, self._sample_file)

    def _shutdown(self, server):
        """Lets roles exit on their own after a good end (workers when told there are no
        more tasks, PS at their next heartbeat), then stops whatever is left. The workers
        always go first: a worker's last push needs its shards, which leave once told the
        job has finished (stopped together, such a push waited until the worker was killed)."""
        self.reports.no_more_tasks = True
        good_end = not self._error and not (self.tasks and self.tasks.failed)
        if good_end:
            self.roles.wait_for_exits(RoleType.WORKER, ROLE_EXIT_GRACE_S)
        self.roles.stop_workers(STOP_GRACE_S)
        self.job_finished = True
        if good_end:
            self.roles.wait_for_exits(RoleType.PS, ROLE_EXIT_GRACE_S)
        self.roles.stop_all(STOP_GRACE_S)
        if self._ps_client is not None:
            self._ps_client.close()
        if server is not None:
            server.stop(grace=1.0)
        if self._status_page is not None:
            self._status_page.close()
        self.outputs.close()
        self.console.close()

    def _summary(self, started):
        num_workers = self.scaling.target
        run = RunFacts(error=self._error, started=started,
                       training_started=self.reports.first_task_at,
                       training_ended=self._training_ended_at,
                       records=self.reports.throughput.records, num_workers=num_workers,
                       resumed_from=self._resumed_from, pushes=self.reports.pushes.by_worker(),
                       skipped=self.reports.skipped_minibatches(),
                       outputs=self.outputs.summary(self.reports),
                       stopped_early=self.stopped_early)
        return build_summary(self.config, run, self._job_state(), self.tasks, self.membership,
                             self.checkpoints)
