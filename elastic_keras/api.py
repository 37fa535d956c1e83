"""Starting a job from Python, for notebooks and pipelines.

Example:

    import elastic_keras

    summary = elastic_keras.train(
        model_zoo="model_zoo", model_def="mnist.mnist_functional",
        training_data="data/train", validation_data="data/test",
        num_workers=2, num_ps=1, minibatch_size=64, num_epochs=3, output="out",
    )
    print(summary.status, summary.evaluations[-1]["metrics"])
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
    if config is None:
        config = JobConfig(**_nest(JobConfig, flags))
    elif flags:
        raise TypeError("train() takes a JobConfig or keyword flags, not both.")
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
