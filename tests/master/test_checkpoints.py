"""The master's side of checkpoints (master/checkpoints.py): paths the shards can use."""

import os

import pytest

from elastic_keras.common.config import JobConfig, PSConfig
from elastic_keras.common.errors import ConfigError
from elastic_keras.master.checkpoints import JobCheckpoints


def test_a_relative_checkpoint_dir_is_made_absolute_for_the_shards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoints = JobCheckpoints("ckpt", steps=10, keep_max=0, job_name="j")
    assert checkpoints.root == os.path.join(str(tmp_path), "ckpt")
    assert checkpoints.enabled and checkpoints.due(10) and not checkpoints.due(9)
    assert not JobCheckpoints("", 10, 0, "j").enabled


def test_shards_are_told_the_checkpoint_dir_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    job = JobConfig(model_def="m", training_data="d", checkpoint_dir="ckpt")
    assert job.ps_config(0, "127.0.0.1:1").checkpoint_dir == os.path.join(str(tmp_path), "ckpt")
    assert JobConfig(model_def="m", training_data="d").ps_config(0, "127.0.0.1:1") \
        .checkpoint_dir == ""
    with pytest.raises(ConfigError, match="must be an absolute path. Received: 'ckpt'"):
        PSConfig(ps_id=0, num_ps=1, master_addr="127.0.0.1:1", checkpoint_dir="ckpt")
