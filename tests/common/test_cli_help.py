"""`--help` of every command and role lists every flag of its config, with its help."""

import dataclasses

import pytest

from elastic_keras import cli
from elastic_keras.common import config as config_lib


@pytest.mark.parametrize("command",
                         ["train", "evaluate", "predict", "export", "scale", "data"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main([command, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    if command in ("train", "evaluate", "predict", "export"):
        assert "--compression" in _flag_names(config_lib.JobConfig)
        for name in _flag_names(config_lib.JobConfig):
            # The command sets the job type: it is no flag to give.
            assert (name in out) == (name != "--job-type"), name
        assert "10% or more" in out


@pytest.mark.parametrize("cls", [config_lib.PSConfig, config_lib.WorkerConfig])
def test_every_role_has_help(cls, capsys):
    with pytest.raises(SystemExit) as exit_:
        config_lib.parse_argv(cls, ["--help"], prog="role")
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    for name in _flag_names(cls):
        assert name in out


def _flag_names(cls):
    """The flags of a config class: its fields', a nested config's fields in its place."""
    names = []
    for field in dataclasses.fields(cls):
        if dataclasses.is_dataclass(field.type):
            names += _flag_names(field.type)
        else:
            names.append("--" + field.name.replace("_", "-"))
    return names
