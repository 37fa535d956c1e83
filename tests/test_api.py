"""`elastic_keras.train(**flags)` takes the command line's flags as keyword arguments, those
of nested configs (`compression=...`) included."""

import pytest

import elastic_keras

from elastic_keras.api import _nest
from elastic_keras.common.config import JobConfig
from elastic_keras.common.errors import ConfigError


def test_transfer_flags_as_keywords_build_the_nested_options():
    config = JobConfig(**_nest(JobConfig, {"model_def": "m.m", "training_data": "d",
                                           "compression": "lz4", "chunk_bytes": 65536}))
    assert (config.transfer.compression, config.transfer.chunk_bytes) == ("lz4", 65536)
    assert config.transfer.transfer_dtype == JobConfig.__dataclass_fields__[
        "transfer"].default.transfer_dtype


def test_a_bad_nested_flag_is_named():
    with pytest.raises(ConfigError, match="--compression must be one of"):
        JobConfig(**_nest(JobConfig, {"model_def": "m.m", "training_data": "d",
                                      "compression": "zip"}))


@pytest.mark.parametrize("name", ["evaluate", "predict", "export"])
def test_each_command_has_a_function_that_refuses_another_job_type(name):
    run = getattr(elastic_keras, name)
    config = JobConfig(model_def="m", training_data="t")
    with pytest.raises(TypeError, match=f"job_type {name!r}"):
        run(config)
    with pytest.raises(ConfigError, match=f"elastic-keras {name} needs"):
        run(model_def="m")  # nothing launched: each lacks its checkpoint or data
