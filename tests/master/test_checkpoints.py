"""The master's side of checkpoints (master/checkpoints.py): paths the shards can use."""

import os

from elastic_keras.master.checkpoints import JobCheckpoints


def test_a_relative_checkpoint_dir_is_made_absolute_for_the_shards(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    checkpoints = JobCheckpoints("ckpt", steps=10, keep_max=0, job_name="j")
    assert checkpoints.root == os.path.join(str(tmp_path), "ckpt")
    assert checkpoints.enabled and checkpoints.due(10) and not checkpoints.due(9)
    assert not JobCheckpoints("", 10, 0, "j").enabled
