import argparse

import pytest

from elastic_keras.common import config as config_lib
from elastic_keras.common.config import JobConfig, PSConfig, WorkerConfig
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.transfer.tensor_stream import TransferOptions


def test_role_configs_round_trip_through_argv():
    job = JobConfig(model_def="m.m", training_data="d", num_ps=3, num_workers=2)
    for cfg in (job.ps_config(2, "127.0.0.1:1"), job.worker_config(1, "127.0.0.1:1")):
        assert config_lib.parse_argv(type(cfg), config_lib.to_argv(cfg)) == cfg


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_workers=0), "--num-workers must be a positive integer. Received: 0"),
        (dict(minibatch_size=-4), "--minibatch-size must be a positive integer"),
        (dict(max_task_retries=-1), "--max-task-retries must be zero or more"),
        (dict(log_level="loud"), "--log-level must be one of"),
        (dict(model_def=" "), "--model-def must not be empty"),
        (dict(transfer="lz4"), "transfer must be a TransferOptions. Received: 'lz4'"),
        (dict(sync_round_timeout_s=0.0), "--sync-round-timeout-s must be positive. Received: 0.0"),
        (dict(checkpoint_steps=5),
         "--checkpoint-steps needs --checkpoint-dir. Received: --checkpoint-steps 5 and no "
         "--checkpoint-dir"),
        (dict(grads_to_wait=3, num_workers=2),
         "--grads-to-wait must be at most --num-workers.*Received: --grads-to-wait 3 with "
         "--num-workers 2"),
    ],
)
def test_bad_job_values_are_named(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig(**{"model_def": "m", "training_data": "d", **kwargs})


def test_transfer_options_reach_both_roles_and_round_trip_through_argv():
    transfer = TransferOptions("lz4", 65536, "bfloat16")
    job = JobConfig(model_def="m", training_data="d", transfer=transfer)
    for cfg in (job.ps_config(0, "127.0.0.1:1"), job.worker_config(0, "127.0.0.1:1")):
        assert cfg.transfer == transfer
        argv = config_lib.to_argv(cfg)
        assert argv[argv.index("--compression"):][:6] == [
            "--compression", "lz4", "--chunk-bytes", "65536", "--transfer-dtype", "bfloat16"]
        back = config_lib.parse_argv(type(cfg), argv)
        assert back == cfg and isinstance(back.transfer, TransferOptions)


def test_transfer_flags_parse_into_the_nested_options():
    parser = argparse.ArgumentParser()
    config_lib.add_arguments(parser, JobConfig)
    job = config_lib.from_namespace(JobConfig, parser.parse_args(
        ["--model-def", "m", "--training-data", "d", "--chunk-bytes", "2048",
         "--transfer-dtype", "float16"]))
    assert job.transfer == TransferOptions("auto", 2048, "float16")
    assert JobConfig(model_def="m", training_data="d").transfer == TransferOptions()
    assert config_lib.parse_argv(JobConfig, config_lib.to_argv(job)) == job


@pytest.mark.parametrize("argv, message", [
    (["--compression", "gzip"],
     "--compression must be one of none, snappy, lz4, auto. Received: 'gzip'"),
    (["--chunk-bytes", "100"],
     "--chunk-bytes must be an integer from 1024 to 268435456. Received: 100"),
    (["--transfer-dtype", "fp8"],
     "--transfer-dtype must be one of float32, float16, bfloat16. Received: 'fp8'"),
])
def test_bad_transfer_flag_exits_2_naming_it(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        config_lib.parse_argv(WorkerConfig, ["--worker-id", "0", "--master-addr", "a",
                                             "--model-def", "m", *argv])
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_a_role_config_takes_the_shared_flags_from_the_job():
    job = JobConfig(model_def="m", training_data="d", num_ps=2, job_name="j",
                    log_level="debug", grads_to_wait=1, host="0.0.0.0", port=7000, tls="auto")
    ps = job.ps_config(1, "127.0.0.1:1", port=9)
    assert (ps.num_ps, ps.job_name, ps.log_level, ps.grads_to_wait, ps.host, ps.port) == (
        2, "j", "debug", 1, "0.0.0.0", 9)
    worker = job.worker_config(0, "127.0.0.1:1")
    assert (worker.model_def, worker.num_ps, worker.sync, worker.overlap) == ("m", 2, True, False)


def test_role_configs_check_the_shared_flags_rules():
    with pytest.raises(ConfigError, match="--num-ps must be a positive integer. Received: 0"):
        WorkerConfig(worker_id=0, master_addr="a", model_def="m", num_ps=0)
    with pytest.raises(ConfigError, match="--master-addr must not be empty. Received: ' '"):
        PSConfig(ps_id=0, num_ps=1, master_addr=" ")


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


@pytest.mark.parametrize("flags, message", [
    ({"host": "0.0.0.0"}, r"--host 0.0.0.0 lets other machines reach.*--tls auto.*"
                          r"Received: --host 0.0.0.0 with --tls off"),
    ({"host": "10.1.2.3"}, r"need TLS"),
    ({"tls_cert": "c.pem"}, r"--tls-cert needs --tls-ca and --tls-key as well"),
    ({"tls": "auto", "tls_cert": "c", "tls_key": "k", "tls_ca": "a"}, r"excludes --tls-cert"),
    ({"tls": "on"}, r"--tls must be one of"),
])
def test_tls_settings_are_checked_before_anything_binds(flags, message):
    with pytest.raises(ConfigError, match=message):
        JobConfig(model_def="m.m", training_data="d", **flags)


def test_tls_auto_binds_anywhere_and_names_the_jobs_certificates():
    job = JobConfig(model_def="m.m", training_data="d", host="0.0.0.0", tls="auto",
                    job_name="My Job")
    assert job.ps_config(0, "h:1").tls_target_name == "my-job.elastic-keras"
    assert job.worker_config(0, "h:1").tls_target_name == "my-job.elastic-keras"
    assert JobConfig(model_def="m.m", training_data="d").worker_config(0, "h:1").tls_ca == ""
