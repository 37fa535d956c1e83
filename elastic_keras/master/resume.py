"""Where a job starts from: a fresh task queue, or the state of the checkpoint it resumes.

The same command run again with the same `--checkpoint-dir` resumes the job from its newest
complete checkpoint: the task queue carries on from its `JobState`, and the parameter
servers restore their shards from the checkpoint's files. With `--checkpoint-dir-for-init`
instead, a new job's model starts from another job's checkpoint.

Evaluate and predict have no training tasks: one round over their data, run by the task
queue as an evaluation round, on the model of `--checkpoint-dir-for-init` (an ensemble:
several models, each on shards of its own). Export has no tasks at all.
"""

import dataclasses
import logging

from elastic_keras.common import job_types
from elastic_keras.common.errors import ConfigError
from elastic_keras.data.shards import list_shards
from elastic_keras.master.checkpoints import init_checkpoint, init_checkpoints
from elastic_keras.master.job_state import JobState
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.tasks import TaskType

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Start:
    """How a run of a job starts.

    Attributes:
        tasks: its `TaskManager`.
        earlier: the `JobState` of the earlier runs (a fresh one for a new job).
        restore_from: the checkpoint the parameter servers start from, or "".
        resumed_from: the checkpoint the job resumes from, or "" for a new job.
        sample_file: a data file (for the SavedModel's input signature), or "".
        members: the checkpoint of each model of an ensemble (the first is `restore_from`).
        data_files: the files of the job's data (evaluate, predict), sorted.
    """

    tasks: TaskManager
    earlier: JobState
    restore_from: str = ""
    resumed_from: str = ""
    sample_file: str = ""
    members: list = dataclasses.field(default_factory=list)
    data_files: list = dataclasses.field(default_factory=list)


def start_job(config, checkpoints):
    """Lists the data and opens the task queue, resuming from `checkpoints` when they hold
    this job's.

    Raises:
        DataError: the data paths match nothing, or a record file is bad.
        ConfigError: the checkpoints belong to another job or to other data or settings.
    """
    if config.job_type != job_types.TRAIN:
        return _start_without_training(config)
    shards = list_shards(config.training_data, config.index_cache_dir)
    eval_shards = (list_shards(config.validation_data, config.index_cache_dir,
                               flag="--validation-data") if config.validation_data else [])
    args = ([(s.path, s.num_records) for s in shards],
            config.records_per_task, config.num_epochs, config.max_task_retries,
            [(s.path, s.num_records) for s in eval_shards])
    seed = None if config.shuffle_seed < 0 else config.shuffle_seed
    resumable = checkpoints.find_resumable()
    if resumable is None:
        start = Start(TaskManager(*args, seed=seed), JobState(config.job_name, tasks={}))
        if config.checkpoint_dir_for_init:
            start.restore_from = init_checkpoint(config.checkpoint_dir_for_init)
            logger.info("The model starts from %s", start.restore_from)
    else:
        path, state = resumable
        try:
            tasks = TaskManager.from_state(state.tasks, *args, seed=seed)
        except ValueError as exc:
            raise ConfigError(f"Cannot resume job {config.job_name!r} from {path}: "
                              f"{exc}") from exc
        start = Start(tasks, state, restore_from=path, resumed_from=path)
        logger.info("Resuming job %s from %s (model version %d, epoch %d of %d)",
                    config.job_name, path, state.model_version,
                    min(tasks.epoch, config.num_epochs - 1) + 1, config.num_epochs)
    start.sample_file = shards[0].path
    start.members = [start.restore_from]
    logger.info("Job %s: %d training records in %d files, %d tasks/epoch", config.job_name,
                start.tasks.records_per_epoch, len(shards), start.tasks.tasks_per_epoch)
    return start


_DATA_FLAGS = {job_types.EVALUATE: ("validation_data", TaskType.EVALUATION),
               job_types.PREDICT: ("prediction_data", TaskType.PREDICTION)}


def _start_without_training(config):
    """Evaluate, predict, export: the restored members and the data's one round."""
    members = init_checkpoints(config)
    name, task_type = _DATA_FLAGS.get(config.job_type, ("", TaskType.EVALUATION))
    given = [n for n in ("prediction_data", "validation_data", "training_data")
             if getattr(config, n)]
    name = name or (given[0] if given else "")  # export: any data, for the input signature
    shards = (list_shards(getattr(config, name), config.index_cache_dir,
                          flag="--" + name.replace("_", "-")) if name else [])
    inferred = config.job_type in _DATA_FLAGS
    round_shards = [(s.path, s.num_records) for s in shards] if inferred else []
    tasks = TaskManager([], config.records_per_task, 1, config.max_task_retries,
                        round_shards, eval_type=task_type)
    for member, path in enumerate(members):
        logger.info("%s %d of %d: %s", "Model" if len(members) == 1 else "Ensemble member",
                    member + 1, len(members), path)
    if round_shards:
        logger.info("Job %s: %d records in %d files", config.job_name, tasks.round_records,
                    len(shards))
    return Start(tasks, JobState(config.job_name, tasks={}), restore_from=members[0],
                 sample_file=shards[0].path if shards else "", members=members,
                 data_files=[s.path for s in shards])
