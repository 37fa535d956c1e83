"""Frozen configuration objects, one per role, and the one place that maps them to flags.

The CLI parses flags once into a `JobConfig`; the master derives each role's `PSConfig` and
`WorkerConfig` from it and turns them back into a command line with `to_argv`. Roles parse
their command line with `parse_argv`. Code receives these objects, never an argparse
namespace.

Example:

    >>> cfg = parse_argv(PSConfig, ["--ps-id", "0", "--num-ps", "1",
    ...                             "--master-addr", "127.0.0.1:5000"])
    >>> parse_argv(PSConfig, to_argv(cfg)) == cfg
    True
"""

import argparse
import dataclasses
import re
from typing import Any

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.transfer.chunking import DEFAULT_CHUNK_BYTES
from elastic_keras.common.transfer.compression import CODEC_NAMES
from elastic_keras.common.transfer.tensor_stream import TRANSFER_DTYPE_NAMES

LOG_LEVELS = ("debug", "info", "warning", "error")
# A plain keras.layers.Embedding of more parameters than this (4 MB of float32) is served
# from the parameter servers: pulling and pushing it whole every step costs more than moving
# the rows a minibatch touches.
EMBEDDING_THRESHOLD_PARAMS = 1_000_000
MIN_CHUNK_BYTES, MAX_CHUNK_BYTES = 1 << 10, 256 << 20


def _flag(default=dataclasses.MISSING, help="", required=False, choices=None):
    """A dataclass field that is also a command-line flag."""
    meta = {"help": help, "required": required, "choices": choices}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _check_positive(config, *names):
    for name in names:
        value = getattr(config, name)
        if value < 1:
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a positive integer. Received: {value!r}"
            )


def _check_non_negative(config, *names):
    for name in names:
        value = getattr(config, name)
        if value < 0:
            raise ConfigError(
                f"--{name.replace('_', '-')} must be zero or more. Received: {value!r}"
            )


def _check_choice(config, name, choices):
    value = getattr(config, name)
    if value not in choices:
        raise ConfigError(
            f"--{name.replace('_', '-')} must be one of {', '.join(choices)}. Received: {value!r}"
        )


def _check_transfer(config):
    """The transfer flags every role shares: --compression, --chunk-bytes, --transfer-dtype."""
    _check_choice(config, "compression", CODEC_NAMES)
    _check_choice(config, "transfer_dtype", TRANSFER_DTYPE_NAMES)
    if not MIN_CHUNK_BYTES <= config.chunk_bytes <= MAX_CHUNK_BYTES:
        raise ConfigError(
            f"--chunk-bytes must be between {MIN_CHUNK_BYTES} and {MAX_CHUNK_BYTES}. "
            f"Received: {config.chunk_bytes!r}"
        )


# The help of the transfer flags, shared by the job's and the roles' configs.
_COMPRESSION_HELP = (
    "How gradients and pulled parameters are compressed, chunk by chunk: none, snappy, lz4, "
    "or auto (snappy, keeping only chunks it shrinks by 10% or more)."
)
_CHUNK_BYTES_HELP = (
    "Pushes and pulls larger than this many bytes are split into chunks of at most this "
    "size, each compressed and checksummed on its own, and streamed."
)
_TRANSFER_DTYPE_HELP = (
    "Precision of gradients, pulled parameters and embedding rows on the wire: float32 "
    "(as they are), float16 or bfloat16. The parameter servers keep float32."
)


@dataclasses.dataclass(frozen=True)
class JobConfig:
    """What `elastic-keras train` runs: the job as a whole, held by the master."""

    model_def: str = _flag(
        required=True,
        help="The model module: 'module', 'pkg.module' or 'pkg.module.custom_model' relative "
        "to --model-zoo, or a path to a .py file.",
    )
    training_data: str = _flag(
        required=True,
        help="Training records: a file, a directory or a glob of TFRecord (.tfrecord, "
        ".tfrecords, .rec) or CSV (.csv, first line a header) files.",
    )
    model_zoo: str = _flag(".", help="The directory --model-def is relative to.")
    validation_data: str = _flag(
        "", help="Evaluation records (same forms as --training-data); evaluated after every "
        "epoch and at the end with the module's eval_metrics_fn."
    )
    job_name: str = _flag("elastic-keras", help="A name for the job, used in logs.")
    num_workers: int = _flag(1, help="Number of worker processes.")
    num_ps: int = _flag(1, help="Number of parameter-server processes.")
    minibatch_size: int = _flag(64, help="Records per minibatch.")
    num_minibatches_per_task: int = _flag(
        8, help="Minibatches per task: a task is minibatch-size x this many records."
    )
    num_epochs: int = _flag(1, help="Passes over the training data.")
    output: str = _flag(
        "", help="Directory for the exported model (saved_model/), job_summary.json and logs/."
    )
    max_task_retries: int = _flag(
        3, help="How many times a failed task is re-queued before the job fails with its error."
    )
    shuffle_seed: int = _flag(
        -1, help="Seed of the per-epoch task shuffle; -1 picks one at random."
    )
    progress_report_minibatches: int = _flag(
        4, help="Workers report progress inside a task every this many minibatches."
    )
    index_cache_dir: str = _flag(
        "", help="Where record-file indexes go when the data directory is read-only "
        "(default: ~/.cache/elastic_keras/index)."
    )
    embedding_threshold_params: int = _flag(
        EMBEDDING_THRESHOLD_PARAMS, help="A plain keras.layers.Embedding with more parameters than this is "
        "served row by row from the parameter servers instead of as a dense variable."
    )
    grads_to_wait: int = _flag(
        0, help="Synchronous training: each PS shard averages this many pushes computed "
        "against its current version, applies them once and bumps its version. 0 trains "
        "asynchronously."
    )
    use_async: bool = _flag(
        False, help="Asynchronous training (the default when --grads-to-wait is 0); "
        "accepted for ElasticDL users."
    )
    max_staleness: int = _flag(
        0, help="Asynchronous training: reject pushes computed against a version more than "
        "this many versions old (the worker pulls and recomputes); 0: no bound."
    )
    lr_staleness_modulation: bool = _flag(
        False, help="Asynchronous training: divide an update's learning rate by "
        "max(1, staleness)."
    )
    sync_round_timeout_s: float = _flag(
        30.0, help="Synchronous training: a round still short of --grads-to-wait pushes "
        "this many seconds after its first is applied with those it has."
    )
    max_stale_retries: int = _flag(
        20, help="How many times in a row a worker recomputes a minibatch whose push was "
        "rejected as stale before it fails the task."
    )
    overlap_communication: bool = _flag(
        True, help="Asynchronous training without --max-staleness: workers push a step's "
        "gradients and pull fresh values while the next step computes (that step then "
        "misses the worker's own previous update)."
    )
    compression: str = _flag("auto", help=_COMPRESSION_HELP)
    chunk_bytes: int = _flag(DEFAULT_CHUNK_BYTES, help=_CHUNK_BYTES_HELP)
    transfer_dtype: str = _flag("float32", help=_TRANSFER_DTYPE_HELP)
    evaluation_steps: int = _flag(
        0, help="Also evaluate --validation-data every this many model versions, with "
        "training paused so every evaluation task sees the same version; 0: after each "
        "epoch only."
    )
    checkpoint_dir: str = _flag(
        "", help="Where the parameter servers' checkpoints and the master's job state go. "
        "Running the same command again with the same --job-name and --checkpoint-dir "
        "resumes the job from its latest checkpoint. Empty: no checkpoints."
    )
    checkpoint_steps: int = _flag(
        0, help="With --checkpoint-dir: checkpoint every this many model versions, and at "
        "the end; 0: at the end only."
    )
    keep_checkpoint_max: int = _flag(
        3, help="Complete checkpoints kept in --checkpoint-dir; older ones are deleted "
        "(0: keep all)."
    )
    checkpoint_dir_for_init: str = _flag(
        "", help="Start the model from the latest complete checkpoint in this directory "
        "(written by any number of parameter servers); the job itself starts afresh."
    )
    relaunch_on_worker_failure: int = _flag(
        3, help="How many times each worker is relaunched after it dies, hangs or is "
        "preempted; past that the job carries on with the workers it has."
    )
    relaunch_on_ps_failure: int = _flag(
        3, help="How many times each parameter server is relaunched after it dies; it "
        "restores its shard from the latest checkpoint and workers wait for it."
    )
    worker_heartbeat_timeout: float = _flag(
        60.0, help="Seconds without a heartbeat after which a worker is taken for dead, "
        "stopped, its tasks re-queued and it is relaunched; 0: never."
    )
    ps_heartbeat_timeout: float = _flag(
        60.0, help="Seconds without a heartbeat after which a registered parameter server "
        "is taken for hung, killed and relaunched (restoring its latest checkpoint); 0: never."
    )
    task_timeout_floor: float = _flag(
        600.0, help="A task held longer than the larger of this many seconds and 3x the "
        "slowest completed task is re-queued and its worker restarted; 0: never."
    )
    host: str = _flag("127.0.0.1", help="Address the master and parameter servers bind to.")
    port: int = _flag(0, help="Master port; 0 picks a free one.")
    log_level: str = _flag("info", help="Logging level.", choices=LOG_LEVELS)

    def __post_init__(self):
        _check_transfer(self)
        _check_positive(
            self, "num_workers", "num_ps", "minibatch_size", "num_minibatches_per_task",
            "num_epochs", "progress_report_minibatches",
        )
        _check_non_negative(self, "max_task_retries", "port", "embedding_threshold_params",
                            "grads_to_wait", "max_staleness", "max_stale_retries",
                            "evaluation_steps", "checkpoint_steps", "keep_checkpoint_max",
                            "relaunch_on_worker_failure", "relaunch_on_ps_failure",
                            "worker_heartbeat_timeout", "ps_heartbeat_timeout",
                            "task_timeout_floor")
        if self.checkpoint_steps and not self.checkpoint_dir:
            raise ConfigError(
                "--checkpoint-steps needs --checkpoint-dir. "
                f"Received: --checkpoint-steps {self.checkpoint_steps} and no --checkpoint-dir"
            )
        if self.evaluation_steps and not self.validation_data:
            raise ConfigError(
                "--evaluation-steps needs --validation-data. "
                f"Received: --evaluation-steps {self.evaluation_steps} and no --validation-data"
            )
        _check_choice(self, "log_level", LOG_LEVELS)
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
        if self.sync_round_timeout_s <= 0:
            raise ConfigError(
                f"--sync-round-timeout-s must be positive. Received: {self.sync_round_timeout_s}"
            )
        for name in ("model_def", "training_data"):
            if not getattr(self, name).strip():
                raise ConfigError(f"--{name.replace('_', '-')} must not be empty.")

    @property
    def records_per_task(self):
        return self.minibatch_size * self.num_minibatches_per_task

    def ps_config(self, ps_id, master_addr, port=0, restore_from="", min_version=0):
        return PSConfig(
            ps_id=ps_id,
            num_ps=self.num_ps,
            master_addr=master_addr,
            grads_to_wait=self.grads_to_wait,
            max_staleness=self.max_staleness,
            lr_staleness_modulation=self.lr_staleness_modulation,
            sync_round_timeout_s=self.sync_round_timeout_s,
            compression=self.compression,
            chunk_bytes=self.chunk_bytes,
            transfer_dtype=self.transfer_dtype,
            job_name=self.job_name,
            host=self.host,
            port=port,
            restore_from=restore_from,
            min_version=min_version,
            log_level=self.log_level,
        )

    def worker_config(self, worker_id, master_addr):
        return WorkerConfig(
            worker_id=worker_id,
            master_addr=master_addr,
            model_zoo=self.model_zoo,
            model_def=self.model_def,
            minibatch_size=self.minibatch_size,
            num_ps=self.num_ps,
            progress_report_minibatches=self.progress_report_minibatches,
            index_cache_dir=self.index_cache_dir,
            embedding_threshold_params=self.embedding_threshold_params,
            sync=self.grads_to_wait > 0,
            max_stale_retries=self.max_stale_retries,
            compression=self.compression,
            chunk_bytes=self.chunk_bytes,
            transfer_dtype=self.transfer_dtype,
            overlap=(self.overlap_communication and not self.grads_to_wait
                     and not self.max_staleness),
            job_name=self.job_name,
            log_level=self.log_level,
        )


@dataclasses.dataclass(frozen=True)
class PSConfig:
    """One parameter-server shard."""

    ps_id: int = _flag(required=True, help="This shard's index, 0 .. num-ps - 1.")
    num_ps: int = _flag(required=True, help="Number of shards in the job.")
    master_addr: str = _flag(required=True, help="host:port of the master.")
    grads_to_wait: int = _flag(0, help="Pushes per synchronous round; 0: asynchronous.")
    max_staleness: int = _flag(0, help="Reject asynchronous pushes staler than this; 0: never.")
    lr_staleness_modulation: bool = _flag(
        False, help="Divide an asynchronous update's learning rate by max(1, staleness)."
    )
    sync_round_timeout_s: float = _flag(
        30.0, help="Apply a synchronous round short of pushes after this many seconds."
    )
    compression: str = _flag("auto", help="Codec of streamed pulls' chunks.")
    chunk_bytes: int = _flag(DEFAULT_CHUNK_BYTES, help="Chunk size of streamed pulls.")
    transfer_dtype: str = _flag("float32", help="Precision of pulled parameters and rows.")
    job_name: str = _flag("elastic-keras", help="The job's name, used in logs.")
    host: str = _flag("127.0.0.1", help="Address to bind to.")
    port: int = _flag(0, help="Port to bind to; 0 picks a free one.")
    restore_from: str = _flag(
        "", help="A checkpoint directory (CHECKPOINT_DIR/ckpt-N) whose state this shard "
        "starts from, re-sharded when it was written by a different number of parameter "
        "servers."
    )
    min_version: int = _flag(
        0, help="The lowest version this shard starts at, from a checkpoint or a new model "
        "(a relaunched shard: the highest it had reached), so versions never go backwards."
    )
    log_level: str = _flag("info", help="Logging level.", choices=LOG_LEVELS)

    def __post_init__(self):
        _check_transfer(self)
        _check_positive(self, "num_ps")
        _check_non_negative(self, "ps_id", "port", "grads_to_wait", "max_staleness",
                            "min_version")
        if self.ps_id >= self.num_ps:
            raise ConfigError(
                f"--ps-id must be below --num-ps ({self.num_ps}). Received: {self.ps_id}"
            )
        _check_choice(self, "log_level", LOG_LEVELS)


@dataclasses.dataclass(frozen=True)
class WorkerConfig:
    """One worker."""

    worker_id: int = _flag(required=True, help="This worker's id.")
    master_addr: str = _flag(required=True, help="host:port of the master.")
    model_def: str = _flag(required=True, help="As for `elastic-keras train`.")
    model_zoo: str = _flag(".", help="As for `elastic-keras train`.")
    minibatch_size: int = _flag(64, help="Records per minibatch.")
    num_ps: int = _flag(1, help="Number of parameter-server shards.")
    progress_report_minibatches: int = _flag(4, help="Report progress every this many minibatches.")
    index_cache_dir: str = _flag("", help="Where record-file indexes go for read-only data.")
    embedding_threshold_params: int = _flag(
        EMBEDDING_THRESHOLD_PARAMS, help="Plain Keras Embeddings larger than this are served from the PS."
    )
    sync: bool = _flag(False, help="Synchronous training: wait for each round's update.")
    max_stale_retries: int = _flag(20, help="Recomputations of a stale minibatch allowed.")
    compression: str = _flag("auto", help="Codec of pushed chunks.")
    chunk_bytes: int = _flag(DEFAULT_CHUNK_BYTES, help="Chunk size of streamed pushes.")
    transfer_dtype: str = _flag("float32", help="Precision of pushed gradients.")
    overlap: bool = _flag(False, help="Push and pull in the background while computing.")
    job_name: str = _flag("elastic-keras", help="The job's name, used in logs.")
    log_level: str = _flag("info", help="Logging level.", choices=LOG_LEVELS)

    def __post_init__(self):
        _check_transfer(self)
        _check_non_negative(self, "worker_id", "embedding_threshold_params")
        _check_positive(self, "minibatch_size", "num_ps", "progress_report_minibatches")
        _check_choice(self, "log_level", LOG_LEVELS)


def _option(name):
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """Adds one kebab-case flag per field of the config class `cls` to `parser`."""
    for field in dataclasses.fields(cls):
        meta = field.metadata
        # argparse formats help with %: a literal one ("10%") must be doubled.
        kwargs: dict[str, Any] = {"dest": field.name,
                                  "help": meta.get("help", "").replace("%", "%%")}
        if field.type in (bool, "bool"):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = {"int": int, "float": float, "str": str}.get(
                field.type if isinstance(field.type, str) else field.type.__name__, str
            )
            kwargs["metavar"] = field.name.upper()
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
        if meta.get("required"):
            kwargs["required"] = True
        else:
            kwargs["default"] = field.default
            if kwargs["help"] and "action" not in kwargs:
                kwargs["help"] += f" (default: {field.default!r})"
        parser.add_argument(_option(field.name), **kwargs)


def normalize_flags(argv):
    """Accepts ElasticDL-style snake_case flags: `--num_workers 2` becomes `--num-workers 2`."""
    out = []
    for arg in argv:
        match = re.match(r"^--([a-z0-9_]+)(=.*)?$", arg)
        if match and "_" in match.group(1):
            arg = "--" + match.group(1).replace("_", "-") + (match.group(2) or "")
        out.append(arg)
    return out


def from_namespace(cls, namespace: argparse.Namespace):
    """Builds a config of class `cls` from the matching attributes of a parsed namespace."""
    values = {f.name: getattr(namespace, f.name) for f in dataclasses.fields(cls)}
    return cls(**values)


def parse_argv(cls, argv, prog=None):
    """Parses a role's command line into a config of class `cls` (exits 2 on a bad flag)."""
    parser = argparse.ArgumentParser(prog=prog, description=cls.__doc__)
    add_arguments(parser, cls)
    namespace = parser.parse_args(normalize_flags(list(argv)))
    try:
        return from_namespace(cls, namespace)
    except ConfigError as exc:
        parser.error(str(exc))


def to_argv(config) -> list:
    """The command-line flags that `parse_argv` turns back into an equal `config`."""
    argv = []
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, bool):
            argv.append(_option(field.name) if value else "--no-" + field.name.replace("_", "-"))
        else:
            argv += [_option(field.name), str(value)]
    return argv
