"""The flags that more than one role's config has, declared once (see `config`).

`SHARED` maps a field name to the arguments of its `flags.flag`; `shared(name)` is the
dataclass field a config declares for it, so `--num-ps`, `--job-name`, `--transfer-dtype`
and the rest mean the same in the job's config and in each role's, which takes them from
the job's.
"""

from elastic_keras.common.embedding_lifecycle import EmbeddingLifecycle
from elastic_keras.common.flags import NON_NEGATIVE, POSITIVE, flag
from elastic_keras.common.transfer.limits import PayloadLimits
from elastic_keras.common.transfer.tensor_stream import TransferOptions

LOG_LEVELS = ("debug", "info", "warning", "error")
# A plain keras.layers.Embedding of more parameters than this (4 MB of float32) is served
# from the parameter servers: pulling and pushing it whole every step costs more than moving
# the rows a minibatch touches.
EMBEDDING_THRESHOLD_PARAMS = 1_000_000

# The flags that more than one config has, declared once: name -> the arguments of `flag`.
SHARED = {
    "master_addr": dict(required=True, help="host:port of the master."),
    "model_def": dict(
        required=True,
        help="The model module: 'module', 'pkg.module' or 'pkg.module.custom_model' relative "
        "to --model-zoo, or a path to a .py file.",
    ),
    "model_zoo": dict(default=".", help="The directory --model-def is relative to."),
    "job_name": dict(default="elastic-keras", help="A name for the job, used in logs."),
    "num_ps": dict(default=1, bound=POSITIVE, help="Number of parameter-server shards, one "
                   "process each."),
    "minibatch_size": dict(default=64, bound=POSITIVE, help="Records per minibatch."),
    "progress_report_minibatches": dict(
        default=4, bound=POSITIVE,
        help="Workers report progress inside a task every this many minibatches.",
    ),
    "index_cache_dir": dict(
        default="", help="Where record-file indexes go when the data directory is read-only "
        "(default: ~/.cache/elastic_keras/index)."
    ),
    "embedding_threshold_params": dict(
        default=EMBEDDING_THRESHOLD_PARAMS, bound=NON_NEGATIVE,
        help="A plain keras.layers.Embedding with more parameters than this is served row by "
        "row from the parameter servers instead of as a dense variable.",
    ),
    "grads_to_wait": dict(
        default=0, bound=NON_NEGATIVE,
        help="Synchronous training: each PS shard averages this many pushes computed against "
        "its current version, applies them once and bumps its version. 0 trains "
        "asynchronously.",
    ),
    "max_staleness": dict(
        default=0, bound=NON_NEGATIVE,
        help="Asynchronous training: reject pushes computed against a version more than this "
        "many versions old (the worker pulls and recomputes); 0: no bound.",
    ),
    "lr_staleness_modulation": dict(
        default=False, help="Asynchronous training: divide an update's learning rate by "
        "max(1, staleness)."
    ),
    "sync_round_timeout_s": dict(
        default=30.0, bound=POSITIVE,
        help="Synchronous training: a round still short of --grads-to-wait pushes this many "
        "seconds after its first is applied with those it has.",
    ),
    "max_stale_retries": dict(
        default=20, bound=NON_NEGATIVE,
        help="How many times in a row a worker recomputes a minibatch whose push was rejected "
        "as stale before it fails the task.",
    ),
    "transfer": dict(default=TransferOptions()),
    "limits": dict(default=PayloadLimits()),  # what a shard accepts (`limits.PayloadLimits`)
    # how tables keep their size (`embedding_lifecycle.EmbeddingLifecycle`)
    "lifecycle": dict(default=EmbeddingLifecycle()),
    "checkpoint_dir": dict(
        default="", help="Where the parameter servers' checkpoints and the master's job state "
        "go. Running the same command again with the same --job-name and --checkpoint-dir "
        "resumes the job from its latest checkpoint. Empty: no checkpoints. A shard writes "
        "only inside it."
    ),
    "on_non_finite_loss": dict(
        default="fail", choices=("fail", "skip"),
        help="A NaN or Inf training loss (or gradient) on a worker: fail fails the job, naming "
        "the minibatch, task and worker; skip drops the minibatch unpushed, counts it "
        "(job_summary.json) and trains on.",
    ),
    "host": dict(default="127.0.0.1", help="Address the master and parameter servers bind to."),
    "log_level": dict(default="info", help="Logging level.", choices=LOG_LEVELS),
}


def shared(name, **changes):
    """The field of the shared flag `name`, with `changes` to its `flag` arguments."""
    return flag(**{**SHARED[name], **changes})
