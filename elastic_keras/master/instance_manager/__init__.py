"""Engines that start, watch and stop a job's roles, chosen by name in `create`."""

from elastic_keras.master.instance_manager.api import (  # noqa: F401
    InstanceManager, RoleExit, RoleSpec, RoleType,
)
from elastic_keras.master.instance_manager.local import LocalInstanceManager

_ENGINES = {"local": LocalInstanceManager}


def create(name, **kwargs):
    """The instance manager called `name` ("local"), built with `kwargs`."""
    try:
        engine = _ENGINES[name]
    except KeyError:
        raise ValueError(
            f"Unknown instance manager; expected one of {sorted(_ENGINES)}. Received: {name!r}"
        ) from None
    return engine(**kwargs)
