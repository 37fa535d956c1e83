"""Engines that start, watch and stop a job's roles, chosen by name with `--engine`."""

import importlib

from elastic_keras.common.errors import ConfigError

from elastic_keras.master.instance_manager.api import (  # noqa: F401
    ExitReason, InstanceManager, RoleExit, RoleId, RoleSpec, RoleType,
)
from elastic_keras.master.instance_manager.local import LocalEngineConfig, LocalInstanceManager

# An engine whose client is an optional dependency is named as "module:class", imported
# only when a job asks for it.
ENGINES = {
    "local": LocalInstanceManager,
    "kubernetes": "elastic_keras.master.instance_manager.kubernetes_pods:"
                  "KubernetesInstanceManager",
    "ray": "elastic_keras.master.instance_manager.ray_actors:RayInstanceManager",
}


def engine_type(name):
    """The engine class registered as `name`.

    Raises:
        ConfigError: no engine has that name.
    """
    try:
        engine = ENGINES[name]
    except KeyError:
        raise ConfigError(
            f"--engine must be one of {sorted(ENGINES)}. Received: --engine {name!r}"
        ) from None
    if isinstance(engine, str):
        module, _, cls = engine.partition(":")
        engine = getattr(importlib.import_module(module), cls)
    return engine


def create(name, job_config=None, on_line=None):
    """The engine called `name`, built from its own config as `job_config`'s flags ask
    (its default config without a job config), printing role lines through `on_line`.

    Raises:
        ConfigError: no engine has that name.
    """
    engine = engine_type(name)
    config = engine.config_type.from_job(job_config) if job_config else engine.config_type()
    return engine(config, on_line=on_line)
