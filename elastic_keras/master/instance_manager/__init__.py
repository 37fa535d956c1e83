"""Engines that start, watch and stop a job's roles, chosen by name with `--engine`."""

from elastic_keras.common.errors import ConfigError

from elastic_keras.master.instance_manager.api import (  # noqa: F401
    ExitReason, InstanceManager, RoleExit, RoleId, RoleSpec, RoleType,
)
from elastic_keras.master.instance_manager.local import LocalEngineConfig, LocalInstanceManager

ENGINES = {"local": LocalInstanceManager}


def engine_type(name):
    """The engine class registered as `name`.

    Raises:
        ConfigError: no engine has that name.
    """
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"--engine must be one of {sorted(ENGINES)}. Received: --engine {name!r}"
        ) from None


def create(name, job_config=None, on_line=None):
    """The engine called `name`, built from its own config as `job_config`'s flags ask
    (its default config without a job config), printing role lines through `on_line`.

    Raises:
        ConfigError: no engine has that name.
    """
    engine = engine_type(name)
    config = engine.config_type.from_job(job_config) if job_config else engine.config_type()
    return engine(config, on_line=on_line)
