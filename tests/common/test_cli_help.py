"""`--help` of every command and role lists every flag of its config, with its help."""

import dataclasses

import pytest

from elastic_keras import cli
from elastic_keras.common import config as config_lib


@pytest.mark.parametrize("command", ["train", "scale", "data"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    if command == "train":
        for field in dataclasses.fields(config_lib.JobConfig):
            assert "--" + field.name.replace("_", "-") in out
        assert "10% or more" in out


@pytest.mark.parametrize("cls", [config_lib.PSConfig, config_lib.WorkerConfig])
def test_every_role_has_help(cls, capsys):
    with pytest.raises(SystemExit) as exit_:
        config_lib.parse_argv(cls, ["--help"], prog="role")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for field in dataclasses.fields(cls):
        assert "--" + field.name.replace("_", "-") in out
