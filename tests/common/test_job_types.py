"""Which flags each job type (train, evaluate, predict, export) needs and refuses, as a user
types them: through the CLI's parser."""

import pytest

from elastic_keras import cli
from elastic_keras.common import config as config_lib
from elastic_keras.common.errors import ConfigError


def _config(command, *flags):
    args = cli.build_parser().parse_args([command, "--model-def", "m", *flags])
    return config_lib.from_namespace(config_lib.JobConfig, args)


@pytest.mark.parametrize("command, flags, message", [
    ("train", [], "elastic-keras train needs --training-data"),
    ("evaluate", ["--checkpoint-dir-for-init", "c"], "evaluate needs --validation-data"),
    ("predict", ["--checkpoint-dir-for-init", "c"], "predict needs --prediction-data"),
    ("evaluate", ["--validation-data", "v"], "evaluate needs --checkpoint-dir-for-init"),
    ("export", ["--checkpoint-dir-for-init", "c"], "export needs --output"),
    ("evaluate", ["--validation-data", "v", "--checkpoint-dir-for-init", "c",
                  "--num-epochs", "2"], "--num-epochs does not apply to elastic-keras "
                                        "evaluate: it trains nothing. Received: --num-epochs 2"),
    ("predict", ["--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                 "--validation-data", "v"], "--validation-data does not apply to "
                                            "elastic-keras predict: it does not read it"),
    ("predict", ["--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                 "--checkpoint-dir", "d"], "--checkpoint-dir does not apply"),
    ("export", ["--checkpoint-dir-for-init", "c", "--output", "o", "--num-workers", "2"],
     "--num-workers does not apply to elastic-keras export"),
    ("export", ["--checkpoint-dir-for-init", "c", "--output", "o", "--minibatch-size", "8"],
     "--minibatch-size does not apply to elastic-keras export: it runs no workers"),
    ("export", ["--checkpoint-dir-for-init", "c", "--output", "o", "--task-timeout-floor",
                "9"], "--task-timeout-floor does not apply to elastic-keras export"),
    ("export", ["--checkpoint-dir-for-init", "a,b", "--output", "o"], "writes one model"),
    ("predict", ["--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                 "--ensemble-combiner", "vote"], "Received: --ensemble-combiner vote with one "
                                                 "checkpoint directory 'c'"),
    ("evaluate", ["--validation-data", "v", "--checkpoint-dir-for-init", "c,",
                  "--ensemble-combiner", "vote"], "with one checkpoint directory 'c,'"),
    ("train", ["--training-data", "t", "--no-status-page", "--status-port", "8123"],
     "--status-port needs --status-page. Received: --status-port 8123"),
    ("train", ["--training-data", "t", "--prediction-data", "p"],
     "--prediction-data does not apply to elastic-keras train"),
    ("train", ["--training-data", "t", "--checkpoint-dir-for-init", "a,b"],
     "takes one directory when training"),
    ("predict", ["--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                 "--ensemble", "last-0"], "--ensemble must be last-K (K >= 1)"),
    ("predict", ["--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                 "--ensemble", "best-2"], "Received: 'best-2'"),
    ("evaluate", ["--validation-data", "v", "--checkpoint-dir-for-init", "a,b",
                  "--ensemble", "last-2"], "a list of them is an ensemble already"),
])
def test_each_job_type_names_the_flag_it_needs_or_refuses(command, flags, message):
    with pytest.raises(ConfigError) as raised:
        _config(command, *flags)
    assert message in str(raised.value)


def test_the_command_sets_the_job_type_and_the_ensemble_size():
    evaluate = _config("evaluate", "--validation-data", "v", "--checkpoint-dir-for-init",
                       " a , b,c ")
    assert evaluate.job_type == "evaluate" and evaluate.init_checkpoints == ["a", "b", "c"]
    assert evaluate.ensemble_members == 3
    predict = _config("predict", "--prediction-data", "p", "--checkpoint-dir-for-init", "c",
                      "--ensemble", "last-4", "--ensemble-combiner", "vote")
    assert predict.ensemble_members == 4
    worker = predict.worker_config(0, "127.0.0.1:1")
    assert (worker.members, worker.ensemble_combiner) == (4, "vote")
    assert _config("train", "--training-data", "t").ensemble_members == 1


def test_a_members_shard_registers_in_its_own_slot_and_round_trips():
    job = _config("predict", "--prediction-data", "p", "--checkpoint-dir-for-init", "a,b",
                  "--num-ps", "2")
    ps = job.ps_config(3, "127.0.0.1:1", restore_from="/b/ckpt-1")
    assert (ps.ps_id, ps.member, ps.slot) == (1, 1, 3)
    assert config_lib.parse_argv(config_lib.PSConfig, config_lib.to_argv(ps)) == ps


def test_the_job_type_travels_to_a_master_started_elsewhere():
    job = _config("export", "--checkpoint-dir-for-init", "c", "--output", "o")
    assert config_lib.parse_argv(config_lib.JobConfig, config_lib.to_argv(job)) == job


def test_a_job_type_flag_that_contradicts_the_command_is_refused(capsys):
    assert cli.main(["evaluate", "--job-type", "train", "--model-def", "m",
                     "--training-data", "t"]) == 2
    assert "--job-type train contradicts the command" in capsys.readouterr().err
