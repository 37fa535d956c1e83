"""Starting a job from Python, for notebooks and pipelines.

Example:

    import elastic_keras

    summary = elastic_keras.train(
        model_zoo="model_zoo", model_def="mnist.mnist_functional",
        training_data="data/train", validation_data="data/test",
        num_workers=2, num_ps=1, minibatch_size=64, num_epochs=3, output="out",
    )
    print(summary.status, summary.evaluations[-1]["metrics"])

    scored = elastic_keras.evaluate(
        model_zoo="model_zoo", model_def="mnist.mnist_functional",
        validation_data="data/test", checkpoint_dir_for_init="ckpt", output="eval",
    )

`evaluate`, `predict` and `export` take the flags of their commands the same way.
"""

import dataclasses

from elastic_keras.common.config import JobConfig
from elastic_keras.master.main import run_job


def train(config=None, **flags):
    """Trains a model-zoo module with a master, parameter servers and workers.

    The roles run as local subprocesses; this call returns when the job has ended.

    Args:
        config: a `JobConfig`; or leave it out and pass its fields as keyword arguments
            (`model_def=..., training_data=..., num_workers=..., compression=...`: the
            `elastic-keras train` flags in snake_case).

    Returns:
        The `JobSummary` (also written to `output/job_summary.json` when `output` is set).

    Raises:
        ConfigError: a bad setting. ModelSpecError: a bad model module. DataError: data
        paths that match nothing or bad record files. Nothing has been launched then.
    """
    return _run("train", config, flags)


def evaluate(config=None, **flags):
    """`elastic-keras evaluate`: the module's metrics on `validation_data` for the model of
    `checkpoint_dir_for_init`; see `train` for the arguments. The metrics are the summary's
    `evaluations[-1]["metrics"]`."""
    return _run("evaluate", config, flags)


def predict(config=None, **flags):
    """`elastic-keras predict`: every record of `prediction_data` predicted once with the
    model of `checkpoint_dir_for_init`; see `train` for the arguments."""
    return _run("predict", config, flags)


def export(config=None, **flags):
    """`elastic-keras export`: the model of `checkpoint_dir_for_init` as a SavedModel under
    `output`; see `train` for the arguments."""
    return _run("export", config, flags)


def _run(job_type, config, flags):
    if config is None:
        config = JobConfig(**_nest(JobConfig, {**flags, "job_type": job_type}))
    elif flags:
        raise TypeError(f"{job_type}() takes a JobConfig or keyword flags, not both.")
    elif config.job_type != job_type:
        raise TypeError(f"{job_type}() needs a JobConfig of job_type {job_type!r}. "
                        f"Received: job_type {config.job_type!r}")
    return run_job(config)


def _nest(config_type, flags):
    """`flags` with the fields of each nested config (`compression=...` of `transfer`)
    gathered into that config, as the command line has them."""
    flags = dict(flags)
    for field in dataclasses.fields(config_type):
        if dataclasses.is_dataclass(field.default):
            names = {f.name for f in dataclasses.fields(field.default)}
            given = {name: flags.pop(name) for name in names & flags.keys()}
            if given and field.name not in flags:
                flags[field.name] = dataclasses.replace(field.default, **given)
    return flags
