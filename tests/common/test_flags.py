"""Config dataclasses as flags: declared rules, nested configs, and argv both ways."""

import argparse
import dataclasses

import pytest

from elastic_keras.common import flags
from elastic_keras.common.config import JobConfig
from elastic_keras.common.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Inner:
    codec: str = flags.flag("fast", help="The codec.")
    size: int = flags.flag(8, help="The size.", bound=flags.POSITIVE)

    def __post_init__(self):
        flags.check_fields(self)


@dataclasses.dataclass(frozen=True)
class Outer:
    name: str = flags.flag(required=True, help="A name.")
    count: int = flags.flag(0, help="A count.", bound=flags.NON_NEGATIVE)
    rate: float = flags.flag(1.0, help="A rate.", bound=flags.POSITIVE)
    level: str = flags.flag("low", help="A level.", choices=("low", "high"))
    loud: bool = flags.flag(False, help="Louder.")
    inner: Inner = flags.flag(Inner(size=16))

    def __post_init__(self):
        flags.check_fields(self)


def test_nested_config_fields_are_flags_of_their_own():
    outer = flags.parse_argv(Outer, ["--name", "n", "--codec", "slow", "--loud"])
    assert outer == Outer(name="n", loud=True, inner=Inner("slow", 16))
    argv = flags.to_argv(outer)
    assert argv == ["--name", "n", "--count", "0", "--rate", "1.0", "--level", "low", "--loud",
                    "--codec", "slow", "--size", "16"]
    assert flags.parse_argv(Outer, argv) == outer


def test_a_nested_flag_defaults_to_the_nested_default_instance(capsys):
    assert flags.parse_argv(Outer, ["--name", "n"]).inner == Inner(size=16)
    with pytest.raises(SystemExit):
        flags.parse_argv(Outer, ["--help"])
    out = capsys.readouterr().out
    assert "inner options:" in out and "The size. (default: 16)" in out


@pytest.mark.parametrize("kwargs, message", [
    (dict(name=" "), "--name must not be empty. Received: ' '"),
    (dict(count=-1), "--count must be zero or more. Received: -1"),
    (dict(rate=0.0), "--rate must be positive. Received: 0.0"),
    (dict(level="mid"), "--level must be one of low, high. Received: 'mid'"),
    (dict(inner="fast"), "inner must be a Inner. Received: 'fast'"),
])
def test_declared_rules_are_checked_once_when_made(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        Outer(**{"name": "n", **kwargs})


def test_a_nested_configs_error_exits_2_from_parse_argv(capsys):
    with pytest.raises(SystemExit) as info:
        flags.parse_argv(Outer, ["--name", "n", "--size", "0"])
    assert info.value.code == 2
    assert "--size must be a positive integer. Received: 0" in capsys.readouterr().err


def test_snake_case_flags_are_accepted():
    parser = argparse.ArgumentParser()
    flags.add_arguments(parser, JobConfig)
    argv = flags.normalize_flags(
        ["--model_def=m", "--training-data", "d", "--num_workers", "3", "--output", "a_b",
         "--chunk_bytes", "2048"]
    )
    job = flags.from_namespace(JobConfig, parser.parse_args(argv))
    assert (job.model_def, job.num_workers, job.output) == ("m", 3, "a_b")
    assert job.transfer.chunk_bytes == 2048
