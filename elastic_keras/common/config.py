"""Frozen configuration objects, one per role: what each role is told, declared once.

The CLI parses flags once into a `JobConfig`; the master derives each role's `PSConfig` and
`WorkerConfig` from it and turns them back into a command line with `to_argv`. Roles parse
their command line with `parse_argv`. Code receives these objects, never an argparse
namespace. Every field is a flag, with its rules declared beside it and checked once, when
the config is made; `flags` maps fields to flags and back (its `parse_argv`, `to_argv`,
`add_arguments`, `from_namespace` and `normalize_flags` can be imported from here).

A flag that several configs have (`--num-ps`, `--job-name`, ...) is declared once, in
`shared_flags`, and means the same in each: a role's config takes it from the job's. The
`transfer` field, a `TransferOptions`, stands for the flags `--compression`,
`--chunk-bytes` and `--transfer-dtype`; the `limits` field, a `PayloadLimits`, for what a
parameter server accepts (`--max-push-bytes`, `--non-finite-gradients`, ...).

Example:

    >>> cfg = parse_argv(PSConfig, ["--ps-id", "0", "--num-ps", "1",
    ...                             "--master-addr", "127.0.0.1:5000", "--compression", "lz4"])
    >>> cfg.transfer.compression
    'lz4'
    >>> parse_argv(PSConfig, to_argv(cfg)) == cfg
    True
"""

import dataclasses
import os

from elastic_keras.common import job_types
from elastic_keras.common.embedding_lifecycle import EmbeddingLifecycle
from elastic_keras.common.engine_options import ClusterOptions
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.flags import NON_NEGATIVE, POSITIVE, check_fields, flag, flag_name
# What the configs' users parse and write them with, importable from here.
from elastic_keras.common.flags import (  # noqa: F401
    add_arguments, from_namespace, normalize_flags, parse_argv, to_argv,
)
from elastic_keras.common.shared_flags import (  # noqa: F401 - importable from here
    EMBEDDING_THRESHOLD_PARAMS, LOG_LEVELS, SHARED as _SHARED, shared as _shared,
)
from elastic_keras.common.tls import check_job_settings, target_name as tls_target
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.common.transfer.tensor_stream import TransferOptions

@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What `elastic-keras train` runs: the job as a whole, held by the master."""

    model_def: str = _shared("model_def")
    job_type: str = flag(
        job_types.TRAIN, choices=job_types.JOB_TYPES, hidden=True,
        help="What the job does; the command sets it (elastic-keras train, evaluate, predict, "
        "export).",
    )
    training_data: str = flag(
        "", help="Training records (required to train): a file, a directory or a glob of "
        "TFRecord (.tfrecord, .tfrecords, .rec) or CSV (.csv, first line a header) files.",
    )
    model_zoo: str = _shared("model_zoo")
    validation_data: str = flag(
        "", help="Evaluation records (same forms as --training-data); evaluated after every "
        "epoch and at the end with the module's eval_metrics_fn (required by evaluate)."
    )
    prediction_data: str = flag(
        "", help="predict: the records to predict (same forms as --training-data); every "
        "record's prediction goes to the module's PredictionOutputsProcessor, or to "
        "OUTPUT/predictions/ without one."
    )
    job_name: str = _shared("job_name")
    num_workers: int = flag(1, help="Number of worker processes.", bound=POSITIVE)
    max_workers: int = flag(
        1024, bound=POSITIVE,
        help="The most workers the job may run: --num-workers and `elastic-keras scale` "
        "stay at or below it.",
    )
    num_ps: int = _shared("num_ps")
    minibatch_size: int = _shared("minibatch_size")
    num_minibatches_per_task: int = flag(
        8, help="Minibatches per task: a task is minibatch-size x this many records.",
        bound=POSITIVE,
    )
    num_epochs: int = flag(1, help="Passes over the training data.", bound=POSITIVE)
    output: str = flag(
        "", help="Directory for the exported model (saved_model/), job_summary.json and logs/ "
        "(evaluate: evaluation.json; predict: predictions/)."
    )
    max_task_retries: int = flag(
        3, help="How many times a failed task is re-queued before the job fails with its error.",
        bound=NON_NEGATIVE,
    )
    shuffle_seed: int = flag(
        -1, help="Seed of the per-epoch task shuffle; -1 picks one at random."
    )
    progress_report_minibatches: int = _shared("progress_report_minibatches")
    index_cache_dir: str = _shared("index_cache_dir")
    embedding_threshold_params: int = _shared("embedding_threshold_params")
    grads_to_wait: int = _shared("grads_to_wait")
    use_async: bool = flag(
        False, help="Asynchronous training (the default when --grads-to-wait is 0); "
        "accepted for ElasticDL users."
    )
    max_staleness: int = _shared("max_staleness")
    lr_staleness_modulation: bool = _shared("lr_staleness_modulation")
    sync_round_timeout_s: float = _shared("sync_round_timeout_s")
    max_stale_retries: int = _shared("max_stale_retries")
    on_non_finite_loss: str = _shared("on_non_finite_loss")
    overlap_communication: bool = flag(
        True, help="Asynchronous training without --max-staleness: workers push a step's "
        "gradients and pull fresh values while the next step computes (that step then "
        "misses the worker's own previous update)."
    )
    transfer: TransferOptions = _shared("transfer")
    limits: PayloadLimits = _shared("limits")
    lifecycle: EmbeddingLifecycle = _shared("lifecycle")
    evaluation_steps: int = flag(
        0, bound=NON_NEGATIVE,
        help="Also evaluate --validation-data every this many model versions, with training "
        "paused so every evaluation task sees the same version; 0: after each epoch only.",
    )
    checkpoint_dir: str = _shared("checkpoint_dir")
    checkpoint_steps: int = flag(
        0, bound=NON_NEGATIVE,
        help="With --checkpoint-dir: checkpoint every this many model versions, and at the "
        "end; 0: at the end only.",
    )
    keep_checkpoint_max: int = flag(
        3, bound=NON_NEGATIVE,
        help="Complete checkpoints kept in --checkpoint-dir; older ones are deleted "
        "(0: keep all).",
    )
    checkpoint_dir_for_init: str = flag(
        "", help="Start the model from the latest complete checkpoint in this directory "
        "(written by any number of parameter servers); the job itself starts afresh. "
        "evaluate, predict and export use this model (required); evaluate and predict take "
        "a comma-separated list of directories as an ensemble."
    )
    ensemble: str = flag(
        "", help="evaluate, predict: last-K makes an ensemble of the K newest complete "
        "checkpoints of --checkpoint-dir-for-init."
    )
    ensemble_combiner: str = flag(
        "mean", choices=job_types.COMBINERS,
        help="How an ensemble's outputs combine: mean averages them; vote takes, per record, "
        "the class most members rank first (ties: the lowest class), one-hot.",
    )
    relaunch_on_worker_failure: int = flag(
        3, bound=NON_NEGATIVE,
        help="How many times each worker is relaunched after it dies or hangs (a preemption "
        "the engine reports as such, on Kubernetes, does not count); past that the job "
        "carries on with the workers it has.",
    )
    relaunch_on_ps_failure: int = flag(
        3, bound=NON_NEGATIVE,
        help="How many times each parameter server is relaunched after it dies; it restores "
        "its shard from the latest checkpoint and workers wait for it.",
    )
    worker_heartbeat_timeout: float = flag(
        60.0, bound=NON_NEGATIVE,
        help="Seconds without a heartbeat after which a worker is taken for dead, stopped, "
        "its tasks re-queued and it is relaunched; 0: never.",
    )
    ps_heartbeat_timeout: float = flag(
        60.0, bound=NON_NEGATIVE,
        help="Seconds without a heartbeat after which a registered parameter server is taken "
        "for hung, killed and relaunched (restoring its latest checkpoint); 0: never.",
    )
    task_timeout_floor: float = flag(
        600.0, bound=NON_NEGATIVE,
        help="A task held longer than the larger of this many seconds and 3x the slowest "
        "completed task is re-queued and its worker restarted; 0: never.",
    )
    host: str = _shared("host")
    port: int = flag(0, help="Master port; 0 picks a free one.", bound=NON_NEGATIVE)
    advertise_host: str = flag(
        "", help="The address roles reach the master at (on Kubernetes its pod's IP); "
        "default: --host, or this machine's address when --host is 0.0.0.0."
    )
    status_page: bool = flag(
        True, help="Serve the job's status page, /status.json and /metrics on 127.0.0.1 "
        "(the address is printed at the start; `elastic-keras status` reads it)."
    )
    status_port: int = flag(0, bound=NON_NEGATIVE,
                            help="The status page's port; 0 picks a free one.")
    engine: str = flag(
        "local", help="What runs the parameter servers and workers: local (subprocesses of "
        "the master, on this machine), kubernetes (pods) or ray (actors).",
    )
    cluster: ClusterOptions = flag(ClusterOptions())
    tls: str = flag(
        "off", choices=("off", "auto"),
        help="TLS between the job's roles. auto: the master makes a certificate authority for "
        "this job alone and a certificate for every role, all mutually authenticated. "
        "Required (or --tls-cert/--tls-key/--tls-ca) when --host is not a loopback address.",
    )
    tls_cert: str = flag("", help="Your own PEM certificate, presented by every role (with "
                         "--tls-key and --tls-ca instead of --tls auto).")
    tls_key: str = flag("", help="The PEM private key of --tls-cert.")
    tls_ca: str = flag("", help="The PEM certificate of the CA that signed --tls-cert; roles "
                       "accept only peers it signed.")
    log_level: str = _shared("log_level")

    def __post_init__(self):
        check_fields(self)
        job_types.check(self)
        self.cluster.check_engine(self.engine)
        check_job_settings(self)
        _requires(self, "checkpoint_steps", "checkpoint_dir")
        _requires(self, "evaluation_steps", "validation_data")
        _requires(self, "status_port", "status_page")
        if self.use_async and self.grads_to_wait:
            raise ConfigError(
                "--use-async and --grads-to-wait exclude each other: --grads-to-wait K >= 1 "
                f"trains synchronously. Received: --use-async --grads-to-wait {self.grads_to_wait}"
            )
        if self.grads_to_wait and (self.max_staleness or self.lr_staleness_modulation):
            raise ConfigError(
                "--max-staleness and --lr-staleness-modulation apply to asynchronous training "
                f"only. Received: them with --grads-to-wait {self.grads_to_wait}"
            )
        if self.grads_to_wait > self.num_workers:
            raise ConfigError(
                "--grads-to-wait must be at most --num-workers: a round waits for that many "
                f"workers' pushes. Received: --grads-to-wait {self.grads_to_wait} with "
                f"--num-workers {self.num_workers}"
            )
        if self.num_workers > self.max_workers:
            raise ConfigError(f"--num-workers must be at most --max-workers {self.max_workers}. "
                              f"Received: --num-workers {self.num_workers}")

    @property
    def records_per_task(self):
        return self.minibatch_size * self.num_minibatches_per_task

    @property
    def init_checkpoints(self):
        """The directories of `--checkpoint-dir-for-init`, in order (several: an ensemble)."""
        return [d.strip() for d in self.checkpoint_dir_for_init.split(",") if d.strip()]

    @property
    def ensemble_members(self):
        """Models the job runs side by side: 1, or an ensemble's members."""
        return job_types.ensemble_size(self) or max(1, len(self.init_checkpoints))

    @property
    def tls_target_name(self):
        """The name the job's certificates carry with --tls auto ("" otherwise: hosts)."""
        return tls_target(self.job_name) if self.tls == "auto" else ""

    def ps_config(self, slot, master_addr, port=0, restore_from="", min_version=0,
                  learning_rate=-1.0):
        """The config of the parameter server in `slot` (shard `slot % num_ps` of ensemble
        member `slot // num_ps`): the job's shared flags, and these."""
        # Absolute: a shard's working directory need not be the master's.
        checkpoint_dir = os.path.abspath(self.checkpoint_dir) if self.checkpoint_dir else ""
        return _role_config(PSConfig, self, ps_id=slot % self.num_ps,
                            member=slot // self.num_ps, master_addr=master_addr, port=port,
                            restore_from=restore_from, min_version=min_version,
                            learning_rate=learning_rate, tls_target_name=self.tls_target_name,
                            checkpoint_dir=checkpoint_dir)

    def worker_config(self, worker_id, master_addr):
        """The config of worker `worker_id`: the job's shared flags, and these."""
        return _role_config(
            WorkerConfig, self, worker_id=worker_id, master_addr=master_addr,
            tls_target_name=self.tls_target_name, sync=self.grads_to_wait > 0,
            overlap=(self.overlap_communication and not self.grads_to_wait
                     and not self.max_staleness),
            members=self.ensemble_members, ensemble_combiner=self.ensemble_combiner,
        )


def _requires(config, name, needed):
    """Raises if the flag `name` is set while the flag `needed` is not."""
    value = getattr(config, name)
    if value and not getattr(config, needed):
        raise ConfigError(f"{flag_name(name)} needs {flag_name(needed)}. "
                          f"Received: {flag_name(name)} {value} and no {flag_name(needed)}")


def _role_config(cls, job, **own):
    """A role's config of class `cls`: each shared flag it has as `job` has it, and `own`."""
    shared = {field.name: getattr(job, field.name) for field in dataclasses.fields(cls)
              if field.name in _SHARED and field.name not in own}
    return cls(**shared, **own)


@dataclasses.dataclass(frozen=True)
class PSConfig:
    """One parameter-server shard."""

    ps_id: int = flag(required=True, help="This shard's index, 0 .. num-ps - 1.",
                      bound=NON_NEGATIVE)
    num_ps: int = _shared("num_ps", default=dataclasses.MISSING, required=True)
    master_addr: str = _shared("master_addr")
    member: int = flag(
        0, bound=NON_NEGATIVE,
        help="The ensemble member whose shard this is (evaluate, predict); it talks to the "
        "master as shard member x num-ps + ps-id.",
    )
    grads_to_wait: int = _shared("grads_to_wait")
    max_staleness: int = _shared("max_staleness")
    lr_staleness_modulation: bool = _shared("lr_staleness_modulation")
    sync_round_timeout_s: float = _shared("sync_round_timeout_s")
    transfer: TransferOptions = _shared("transfer")
    limits: PayloadLimits = _shared("limits")
    lifecycle: EmbeddingLifecycle = _shared("lifecycle")
    job_name: str = _shared("job_name")
    host: str = _shared("host")
    port: int = flag(0, help="Port to bind to; 0 picks a free one. A relaunched shard is "
                     "asked for its predecessor's and takes a free one if that is taken.",
                     bound=NON_NEGATIVE)
    advertise_host: str = flag(
        "", help="The address workers reach this shard at (the engine gives it: on Kubernetes "
        "the pod's IP); default: --host, or this machine's address when --host is 0.0.0.0."
    )
    checkpoint_dir: str = _shared("checkpoint_dir")
    restore_from: str = flag(
        "", help="A checkpoint directory (CHECKPOINT_DIR/ckpt-N) whose state this shard "
        "starts from, re-sharded when it was written by a different number of parameter "
        "servers."
    )
    min_version: int = flag(
        0, bound=NON_NEGATIVE,
        help="The lowest version this shard starts at, from a checkpoint or a new model (a "
        "relaunched shard: the highest it had reached), so versions never go backwards.",
    )
    learning_rate: float = flag(
        -1.0, help="The learning rate the job's callbacks set, for a relaunched shard (the "
        "master gives it); -1: the optimizer's own.",
    )
    secret_file: str = flag(
        "", help="A file only this user can read, holding the job's secret: the shard checks "
        "every caller's credential with it. The master's engine provides it."
    )
    tls_ca: str = flag("", help="TLS: the job CA's PEM certificate (the engine provides it).")
    tls_cert: str = flag("", help="TLS: this role's PEM certificate (the engine provides it).")
    tls_key: str = flag("", help="TLS: this role's PEM key (the engine provides it).")
    tls_target_name: str = flag("", help="TLS: the name peers' certificates carry; empty: "
                                "the host they are reached at.")
    log_level: str = _shared("log_level")

    def __post_init__(self):
        check_fields(self)
        if self.ps_id >= self.num_ps:
            raise ConfigError(
                f"--ps-id must be below --num-ps ({self.num_ps}). Received: {self.ps_id}"
            )
        if self.checkpoint_dir and not os.path.isabs(self.checkpoint_dir):
            raise ConfigError("A shard's --checkpoint-dir must be an absolute path. "
                              f"Received: {self.checkpoint_dir!r}")

    @property
    def slot(self):
        """This shard's place among the job's shards: what it registers as."""
        return self.member * self.num_ps + self.ps_id


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """One worker."""

    worker_id: int = flag(required=True, help="This worker's id.", bound=NON_NEGATIVE)
    master_addr: str = _shared("master_addr")
    model_def: str = _shared("model_def")
    model_zoo: str = _shared("model_zoo")
    minibatch_size: int = _shared("minibatch_size")
    num_ps: int = _shared("num_ps")
    progress_report_minibatches: int = _shared("progress_report_minibatches")
    index_cache_dir: str = _shared("index_cache_dir")
    embedding_threshold_params: int = _shared("embedding_threshold_params")
    sync: bool = flag(False, help="Synchronous training: wait for each round's update.")
    max_stale_retries: int = _shared("max_stale_retries")
    on_non_finite_loss: str = _shared("on_non_finite_loss")
    transfer: TransferOptions = _shared("transfer")
    overlap: bool = flag(False, help="Push and pull in the background while computing.")
    members: int = flag(
        1, bound=POSITIVE,
        help="Ensemble members (evaluate, predict): the shards come in this many groups of "
        "--num-ps, each one member's model.",
    )
    ensemble_combiner: str = flag("mean", choices=job_types.COMBINERS,
                                  help="How an ensemble's outputs combine.")
    job_name: str = _shared("job_name")
    credential_file: str = flag(
        "", help="A file only this user can read, holding this worker's credential. The "
        "master's engine provides it."
    )
    tls_ca: str = flag("", help="TLS: the job CA's PEM certificate (the engine provides it).")
    tls_cert: str = flag("", help="TLS: this role's PEM certificate (the engine provides it).")
    tls_key: str = flag("", help="TLS: this role's PEM key (the engine provides it).")
    tls_target_name: str = flag("", help="TLS: the name peers' certificates carry; empty: "
                                "the host they are reached at.")
    log_level: str = _shared("log_level")

    def __post_init__(self):
        check_fields(self)
