"""What a job does, and the flags each kind of job reads.

`elastic-keras train` trains. `evaluate`, `predict` and `export` run the same master,
parameter servers, workers and engines on a model restored from `--checkpoint-dir-for-init`
(a checkpoint directory, or a comma-separated list of them; with `--ensemble last-K`, the K
newest complete checkpoints of one directory):

- evaluate: the module's `eval_metrics_fn` over `--validation-data`, at the restored version;
- predict: the model over `--prediction-data`; every record's prediction goes to the module's
  `PredictionOutputsProcessor`, or to files under `--output`;
- export: a serving SavedModel under `--output`, written from the restored shards (no
  workers).

Evaluate and predict accept several checkpoints, an ensemble whose members' outputs are
combined (`--ensemble-combiner mean|vote`). A flag only training reads is an error with the
others, as is a data flag the job does not read: a flag that would be silently ignored
is refused.
"""

import dataclasses

from elastic_keras.common.errors import ConfigError

TRAIN, EVALUATE, PREDICT, EXPORT = "train", "evaluate", "predict", "export"
JOB_TYPES = (TRAIN, EVALUATE, PREDICT, EXPORT)
COMBINERS = ("mean", "vote")

# Flags only training reads.
_TRAINING_ONLY = (
    "num_epochs", "shuffle_seed", "grads_to_wait", "use_async", "max_staleness",
    "lr_staleness_modulation", "sync_round_timeout_s", "max_stale_retries",
    "on_non_finite_loss", "overlap_communication", "evaluation_steps", "checkpoint_dir",
    "checkpoint_steps", "keep_checkpoint_max",
)
# Flags only workers read.
_WORKERS_ONLY = (
    "num_workers", "max_workers", "minibatch_size", "num_minibatches_per_task",
    "max_task_retries", "progress_report_minibatches", "relaunch_on_worker_failure",
    "worker_heartbeat_timeout", "task_timeout_floor",
)
# Per job type: the data flag it reads (required), and the other flags it refuses.
_DATA = {TRAIN: "training_data", EVALUATE: "validation_data", PREDICT: "prediction_data"}
_REFUSED = {
    TRAIN: ("prediction_data", "ensemble", "ensemble_combiner"),
    EVALUATE: _TRAINING_ONLY + ("training_data", "prediction_data"),
    PREDICT: _TRAINING_ONLY + ("training_data", "validation_data"),
    # Export reads no data flag (one may be given: its first records shape the SavedModel's
    # input signature) and runs no workers.
    EXPORT: _TRAINING_ONLY + _WORKERS_ONLY + ("ensemble", "ensemble_combiner"),
}
_ENSEMBLE_PREFIX = "last-"


def check(job):
    """Checks the flags of `job`, a `JobConfig`, against its `job_type`.

    Raises:
        ConfigError: a flag the job type needs is missing, or one it does not read is given
            (naming the flag, the value received and the command).
    """
    command = f"elastic-keras {job.job_type}"
    data = _DATA.get(job.job_type)
    if data and not getattr(job, data).strip():
        raise ConfigError(f"{command} needs {_flag(data)}. Received: no {_flag(data)}")
    for name in _REFUSED[job.job_type]:
        if _given(job, name):
            why = ("it trains nothing" if name in _TRAINING_ONLY
                   else "it runs no workers" if name in _WORKERS_ONLY and job.job_type == EXPORT
                   else "it does not read it")
            raise ConfigError(f"{_flag(name)} does not apply to {command}: {why}. "
                              f"Received: {_flag(name)} {getattr(job, name)!r}")
    if job.job_type == TRAIN:
        if "," in job.checkpoint_dir_for_init:
            raise ConfigError(
                "--checkpoint-dir-for-init takes one directory when training (several "
                "make an ensemble, for evaluate and predict). Received: "
                f"{job.checkpoint_dir_for_init!r}")
        return
    if not job.checkpoint_dir_for_init.strip():
        raise ConfigError(f"{command} needs --checkpoint-dir-for-init: the checkpoint whose "
                          "model it uses. Received: no --checkpoint-dir-for-init")
    if job.job_type == EXPORT and not job.output:
        raise ConfigError(f"{command} needs --output: where the SavedModel goes. "
                          "Received: no --output")
    if job.job_type == EXPORT and "," in job.checkpoint_dir_for_init:
        raise ConfigError(f"{command} writes one model: --checkpoint-dir-for-init takes one "
                          f"directory. Received: {job.checkpoint_dir_for_init!r}")
    if job.ensemble:
        ensemble_size(job)
    elif _given(job, "ensemble_combiner") and len(job.init_checkpoints) < 2:
        raise ConfigError(
            "--ensemble-combiner combines the outputs of an ensemble: it needs several "
            "--checkpoint-dir-for-init directories or --ensemble last-K. Received: "
            f"--ensemble-combiner {job.ensemble_combiner} with one checkpoint directory "
            f"{job.checkpoint_dir_for_init!r}")


def ensemble_size(job):
    """K of `--ensemble last-K` (0 without it).

    Raises:
        ConfigError: the value is not last-K with K >= 1, or it comes with a list of
            checkpoint directories.
    """
    if not job.ensemble:
        return 0
    k = job.ensemble[len(_ENSEMBLE_PREFIX):]
    if not job.ensemble.startswith(_ENSEMBLE_PREFIX) or not k.isdigit() or int(k) < 1:
        raise ConfigError("--ensemble must be last-K (K >= 1): the K newest complete "
                          f"checkpoints of --checkpoint-dir-for-init. Received: {job.ensemble!r}")
    if "," in job.checkpoint_dir_for_init:
        raise ConfigError(
            "--ensemble last-K takes one checkpoint directory; a list of them is an ensemble "
            f"already. Received: --ensemble {job.ensemble} with --checkpoint-dir-for-init "
            f"{job.checkpoint_dir_for_init!r}")
    return int(k)


def _given(job, name):
    field = next(f for f in dataclasses.fields(job) if f.name == name)
    return getattr(job, name) != field.default


def _flag(name):
    return "--" + name.replace("_", "-")
