"""Where a job starts from: a fresh task queue, or the state of the checkpoint it resumes.

The same command run again with the same `--checkpoint-dir` resumes the job from its newest
complete checkpoint: the task queue carries on from its `JobState`, and the parameter
servers restore their shards from the checkpoint's files. With `--checkpoint-dir-for-init`
instead, a new job's model starts from another job's checkpoint.
"""

import dataclasses
import logging

from elastic_keras.common.errors import ConfigError
from elastic_keras.data.shards import list_shards
from elastic_keras.master.checkpoints import init_checkpoint
from elastic_keras.master.job_state import JobState
from elastic_keras.master.task_manager import TaskManager

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Start:
    """How a run of a job starts.

    Attributes:
        tasks: its `TaskManager`.
        earlier: the `JobState` of the earlier runs (a fresh one for a new job).
        restore_from: the checkpoint the parameter servers start from, or "".
        resumed_from: the checkpoint the job resumes from, or "" for a new job.
        sample_file: a training file (for the SavedModel's input signature).
    """

    tasks: TaskManager
    earlier: JobState
    restore_from: str = ""
    resumed_from: str = ""
    sample_file: str = ""


def start_job(config, checkpoints):
    """Lists the data and opens the task queue, resuming from `checkpoints` when they hold
    this job's.

    Raises:
        DataError: the data paths match nothing, or a record file is bad.
        ConfigError: the checkpoints belong to another job or to other data or settings.
    """
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
    logger.info("Job %s: %d training records in %d files, %d tasks/epoch", config.job_name,
                start.tasks.records_per_epoch, len(shards), start.tasks.tasks_per_epoch)
    return start
