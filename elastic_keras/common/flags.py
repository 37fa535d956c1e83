"""Config dataclasses as command-line flags: one flag per field, read and written here only.

A field made with `flag` carries its flag's help and rules (required, a set of choices, a
bound); `check_fields` checks them when a config is made. `add_arguments` adds a config's
flags to a parser, `from_namespace` and `parse_argv` build the config from parsed flags, and
`to_argv` writes the flags that build an equal config: a role's command line is generated
from its config here and nowhere else. A field named `max_staleness` is the flag
`--max-staleness`. A field that holds a nested config dataclass (with a default instance)
stands for that config's fields, each a flag of its own.

Example:

    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Shard:
    ...     shard_id: int = flag(required=True, help="Index of the shard.", bound=NON_NEGATIVE)
    ...     verbose: bool = flag(False, help="Log more.")
    ...     def __post_init__(self):
    ...         check_fields(self)
    >>> shard = parse_argv(Shard, ["--shard-id", "3", "--verbose"])
    >>> to_argv(shard), parse_argv(Shard, to_argv(shard)) == shard
    (['--shard-id', '3', '--verbose'], True)
"""

import argparse
import dataclasses
import re
from typing import Any

from elastic_keras.common.errors import ConfigError

# The bounds a numeric flag may declare.
POSITIVE, NON_NEGATIVE = "positive", "non-negative"
_TYPES = {"int": int, "float": float, "str": str}


def flag(default=dataclasses.MISSING, help="", required=False, choices=None, bound=None,
         hidden=False):
    """A dataclass field that is also a command-line flag.

    Args:
        default: the value when the flag is not given; for a field that holds a nested
            config, its default instance.
        help: the flag's help.
        required: the flag must be given (and a string flag must not be blank).
        choices: the values allowed.
        bound: `POSITIVE` or `NON_NEGATIVE`, for a number.
        hidden: left out of `--help` (a flag a command sets for the user).
    """
    meta = {"help": help, "required": required, "choices": choices, "bound": bound,
            "hidden": hidden}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def flag_name(field_name):
    """The flag of a field: `max_staleness` is `--max-staleness`."""
    return "--" + field_name.replace("_", "-")


def check_fields(config):
    """Checks every field of `config` against the rules declared with it by `flag`.

    Raises:
        ConfigError: naming the flag, its rule and the value received.
    """
    for field in dataclasses.fields(config):
        value, meta, name = getattr(config, field.name), field.metadata, flag_name(field.name)
        if dataclasses.is_dataclass(field.type):
            rule = f"{field.name} must be a {field.type.__name__}"
            broken = not isinstance(value, field.type)
        elif meta.get("required") and isinstance(value, str):
            rule, broken = f"{name} must not be empty", not value.strip()
        elif meta.get("choices"):
            rule = f"{name} must be one of {', '.join(meta['choices'])}"
            broken = value not in meta["choices"]
        elif meta.get("bound") == POSITIVE:
            kind = "a positive integer" if field.type in (int, "int") else "positive"
            rule, broken = f"{name} must be {kind}", value <= 0
        elif meta.get("bound") == NON_NEGATIVE:
            rule, broken = f"{name} must be zero or more", value < 0
        else:
            continue
        if broken:
            raise ConfigError(f"{rule}. Received: {value!r}")


def add_arguments(parser: argparse.ArgumentParser, cls) -> None:
    """Adds one kebab-case flag per field of the config class `cls` to `parser`; a field
    holding a nested config adds that config's flags, in a group of their own."""
    _add_flags(parser, cls, defaults=None)


def _add_flags(parser, cls, defaults):
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field.type):
            group = parser.add_argument_group(f"{field.name} options")
            _add_flags(group, field.type, defaults=field.default)
            continue
        meta = field.metadata
        # argparse formats help with %: a literal one ("10%") must be doubled.
        kwargs: dict[str, Any] = {"dest": field.name,
                                  "help": meta.get("help", "").replace("%", "%%")}
        if field.type in (bool, "bool"):
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            type_name = field.type if isinstance(field.type, str) else field.type.__name__
            kwargs["type"] = _TYPES.get(type_name, str)
            kwargs["metavar"] = field.name.upper()
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
        if meta.get("hidden"):
            kwargs["help"] = argparse.SUPPRESS
        if meta.get("required"):
            kwargs["required"] = True
        else:
            default = field.default if defaults is None else getattr(defaults, field.name)
            kwargs["default"] = default
            if kwargs["help"] and "action" not in kwargs and not meta.get("hidden"):
                kwargs["help"] += f" (default: {default!r})"
        parser.add_argument(flag_name(field.name), **kwargs)


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
    """Builds a config of class `cls` from the matching attributes of a parsed namespace
    (a nested config from the attributes its own fields name)."""
    values = {}
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field.type):
            values[field.name] = from_namespace(field.type, namespace)
        else:
            values[field.name] = getattr(namespace, field.name)
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
        if dataclasses.is_dataclass(value):
            argv += to_argv(value)
        elif isinstance(value, bool):
            argv.append(flag_name(field.name) if value else "--no-" + field.name.replace("_", "-"))
        else:
            argv += [flag_name(field.name), str(value)]
    return argv
