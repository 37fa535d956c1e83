import argparse

import pytest

from elastic_keras.common import config as config_lib
from elastic_keras.common.config import JobConfig, PSConfig, WorkerConfig
from elastic_keras.common.errors import ConfigError


def test_role_configs_round_trip_through_argv():
    job = JobConfig(model_def="m.m", training_data="d", num_ps=3, num_workers=2)
    for cfg in (job.ps_config(2, "127.0.0.1:1"), job.worker_config(1, "127.0.0.1:1")):
        assert config_lib.parse_argv(type(cfg), config_lib.to_argv(cfg)) == cfg


def test_snake_case_flags_are_accepted():
    parser = argparse.ArgumentParser()
    config_lib.add_arguments(parser, JobConfig)
    argv = config_lib.normalize_flags(
        ["--model_def=m", "--training-data", "d", "--num_workers", "3", "--output", "a_b"]
    )
    job = config_lib.from_namespace(JobConfig, parser.parse_args(argv))
    assert (job.model_def, job.num_workers, job.output) == ("m", 3, "a_b")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_workers=0), "--num-workers must be a positive integer. Received: 0"),
        (dict(minibatch_size=-4), "--minibatch-size must be a positive integer"),
        (dict(max_task_retries=-1), "--max-task-retries must be zero or more"),
        (dict(log_level="loud"), "--log-level must be one of"),
        (dict(model_def=" "), "--model-def must not be empty"),
        (dict(compression="gzip"),
         "--compression must be one of none, snappy, lz4, auto. Received: 'gzip'"),
        (dict(chunk_bytes=100), "--chunk-bytes must be between 1024 and 268435456. Received: 100"),
        (dict(transfer_dtype="fp8"),
         "--transfer-dtype must be one of float32, float16, bfloat16. Received: 'fp8'"),
        (dict(grads_to_wait=3, num_workers=2),
         "--grads-to-wait must be at most --num-workers.*Received: --grads-to-wait 3 with "
         "--num-workers 2"),
    ],
)
def test_bad_job_values_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig(**{"model_def": "m", "training_data": "d", **kwargs})


def test_transfer_flags_reach_both_roles():
    job = JobConfig(model_def="m", training_data="d", compression="lz4", chunk_bytes=65536,
                    transfer_dtype="bfloat16")
    for cfg in (job.ps_config(0, "127.0.0.1:1"), job.worker_config(0, "127.0.0.1:1")):
        assert (cfg.compression, cfg.chunk_bytes, cfg.transfer_dtype) == ("lz4", 65536, "bfloat16")
        assert config_lib.parse_argv(type(cfg), config_lib.to_argv(cfg)) == cfg


def test_ps_id_must_be_below_num_ps():
    with pytest.raises(ConfigError, match="--ps-id must be below --num-ps"):
        PSConfig(ps_id=2, num_ps=2, master_addr="x")


def test_configs_are_frozen():
    cfg = WorkerConfig(worker_id=0, master_addr="a", model_def="m")
    with pytest.raises(Exception):
        cfg.worker_id = 1


def test_bad_role_flag_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        config_lib.parse_argv(PSConfig, ["--ps-id", "5", "--num-ps", "1", "--master-addr", "a"])
    assert info.value.code == 2
    assert "--ps-id must be below --num-ps (1). Received: 5" in capsys.readouterr().err
