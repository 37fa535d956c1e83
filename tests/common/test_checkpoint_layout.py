"""The checkpoint directory layout: names, manifests, what counts as complete, pruning."""

import json
import logging
import os

import pytest

from elastic_keras.common import checkpoint_layout
from elastic_keras.common.errors import CheckpointError


def make_checkpoint(root, number, num_ps=2, manifest=True, **extra):
    """A checkpoint whose shard files hold made-up bytes; returns its path."""
    path = checkpoint_layout.checkpoint_path(str(root), number)
    os.makedirs(path)
    shards = []
    for ps_id in range(num_ps):
        name = checkpoint_layout.shard_file_name(ps_id, num_ps)
        with open(os.path.join(path, name), "wb") as f:
            f.write(bytes(range(256)) * (ps_id + number))
        crc, size = checkpoint_layout.file_crc32c(os.path.join(path, name))
        shards.append(checkpoint_layout.ShardFile(name, size, crc, 10 * number))
    if manifest:
        checkpoint_layout.write_manifest(path, {"number": number, "num_ps": num_ps, "shards": shards,
                                     **extra})
    return path


def numbers(root):
    return [number for number, _ in checkpoint_layout.list_checkpoints(str(root))]


def test_names():
    assert checkpoint_layout.checkpoint_path("/ckpt", 12) == "/ckpt/ckpt-00000012"
    assert checkpoint_layout.shard_file_name(1, 2) == "ps-1-of-2.ckpt"
    with pytest.raises(ValueError, match="Received: 0"):
        checkpoint_layout.checkpoint_path("/ckpt", 0)
    with pytest.raises(ValueError, match="ps_id=2, num_ps=2"):
        checkpoint_layout.shard_file_name(2, 2)


def test_manifest_round_trip_keeps_extra_keys(tmp_path):
    path = make_checkpoint(tmp_path, 3, job_state={"epoch": 2, "records": [1, 2]})
    manifest = checkpoint_layout.read_manifest(path)
    assert manifest["number"] == 3 and manifest["num_ps"] == 2
    assert manifest["job_state"] == {"epoch": 2, "records": [1, 2]}
    assert [s["file"] for s in manifest["shards"]] == ["ps-0-of-2.ckpt", "ps-1-of-2.ckpt"]
    assert manifest["shards"][1]["model_version"] == 30
    assert isinstance(manifest["created"], float)
    assert not [n for n in os.listdir(path) if n.startswith(".")]  # no temporary file left


def test_reading_a_missing_or_bad_manifest_names_the_file(tmp_path):
    path = make_checkpoint(tmp_path, 1, manifest=False)
    with pytest.raises(CheckpointError, match="MANIFEST.json does not exist.*incomplete"):
        checkpoint_layout.read_manifest(path)
    with open(os.path.join(path, checkpoint_layout.MANIFEST), "w") as f:
        f.write('{"number": 1, "num_ps"')
    with pytest.raises(CheckpointError, match=r"ckpt-00000001/MANIFEST.json is not valid JSON"):
        checkpoint_layout.read_manifest(path)
    with open(os.path.join(path, checkpoint_layout.MANIFEST), "w") as f:
        json.dump({"number": 1, "num_ps": 2, "shards": [], "created": 0}, f)
    with pytest.raises(CheckpointError, match="Received: num_ps=2, 0 shards"):
        checkpoint_layout.read_manifest(path)


def test_write_manifest_rejects_shards_that_do_not_match_num_ps(tmp_path):
    with pytest.raises(CheckpointError, match="shards a list of that many"):
        checkpoint_layout.write_manifest(str(tmp_path), {"number": 1, "num_ps": 2, "shards": [
            checkpoint_layout.ShardFile("ps-0-of-2.ckpt", 1, 2, 3)]})
    with pytest.raises(CheckpointError, match="must be 'ps-0-of-1.ckpt'.*'../x'"):
        checkpoint_layout.write_manifest(str(tmp_path), {"number": 1, "num_ps": 1, "shards": [
            {"file": "../x", "bytes": 1, "crc32c": 2, "model_version": 3}]})
    assert not os.path.exists(tmp_path / checkpoint_layout.MANIFEST)


def test_list_checkpoints_sorts_and_ignores_everything_else(tmp_path):
    for number in (10, 2, 7):
        make_checkpoint(tmp_path, number)
    (tmp_path / "ckpt-00000009.tmp").mkdir()
    (tmp_path / ".ckpt-00000011.abc.tmp").write_text("")
    (tmp_path / "ckpt-00000012").write_text("a file, not a directory")
    (tmp_path / "ckpt-1").mkdir()
    (tmp_path / "notes").mkdir()
    assert checkpoint_layout.list_checkpoints(str(tmp_path)) == [
        (2, str(tmp_path / "ckpt-00000002")), (7, str(tmp_path / "ckpt-00000007")),
        (10, str(tmp_path / "ckpt-00000010")),
    ]
    assert checkpoint_layout.list_checkpoints(str(tmp_path / "absent")) == []


def test_latest_complete_is_the_newest_intact_one(tmp_path):
    make_checkpoint(tmp_path, 1)
    newest = make_checkpoint(tmp_path, 2, job_state={"epoch": 1})
    path, manifest = checkpoint_layout.latest_complete(str(tmp_path))
    assert path == newest and manifest["job_state"] == {"epoch": 1}


def test_a_truncated_shard_file_is_skipped_with_a_warning(tmp_path, caplog):
    previous = make_checkpoint(tmp_path, 1)
    newest = make_checkpoint(tmp_path, 2)
    shard = os.path.join(newest, "ps-1-of-2.ckpt")
    os.truncate(shard, os.path.getsize(shard) // 2)
    with caplog.at_level(logging.WARNING):
        for verify in (True, False):
            assert checkpoint_layout.latest_complete(str(tmp_path), verify)[0] == previous
    assert f"Skipping checkpoint {newest}" in caplog.text
    assert f"{shard} has {os.path.getsize(shard)} bytes" in caplog.text


def test_a_corrupt_byte_is_caught_by_the_checksum(tmp_path, caplog):
    previous = make_checkpoint(tmp_path, 1)
    newest = make_checkpoint(tmp_path, 2)
    shard = os.path.join(newest, "ps-0-of-2.ckpt")
    with open(shard, "r+b") as f:
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 0x01]))
    with caplog.at_level(logging.WARNING):
        assert checkpoint_layout.latest_complete(str(tmp_path))[0] == previous
    assert f"{shard} has CRC32C" in caplog.text and "corrupt" in caplog.text
    # Without verification only sizes are checked: the flipped byte goes unseen.
    assert checkpoint_layout.latest_complete(str(tmp_path), verify=False)[0] == newest


def test_a_missing_shard_file_or_manifest_makes_a_checkpoint_incomplete(tmp_path, caplog):
    previous = make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2, manifest=False)
    missing_shard = make_checkpoint(tmp_path, 3)
    os.remove(os.path.join(missing_shard, "ps-0-of-2.ckpt"))
    with caplog.at_level(logging.WARNING):
        assert checkpoint_layout.latest_complete(str(tmp_path))[0] == previous
    assert "ckpt-00000002/MANIFEST.json does not exist" in caplog.text
    assert "ckpt-00000003/ps-0-of-2.ckpt cannot be read" in caplog.text
    assert checkpoint_layout.latest_complete(str(tmp_path / "absent")) is None


def test_temporary_files_of_an_interrupted_write_are_never_taken(tmp_path, monkeypatch):
    previous = make_checkpoint(tmp_path, 1)
    # A shard crashed while writing: only its hidden temporary file exists.
    path = checkpoint_layout.checkpoint_path(str(tmp_path), 2)
    os.makedirs(path)
    with open(os.path.join(path, ".ps-0-of-1.ckpt.x1y2.tmp"), "wb") as f:
        f.write(b"half a shard")
    # The master's manifest write was interrupted (the rename never happened).
    monkeypatch.setattr(json, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError("disk")))
    with pytest.raises(OSError, match="disk"):
        checkpoint_layout.write_manifest(path, {"number": 2, "num_ps": 1, "shards": [
            checkpoint_layout.ShardFile("ps-0-of-1.ckpt", 12, 0, 5)]})
    monkeypatch.undo()
    assert not os.path.exists(os.path.join(path, checkpoint_layout.MANIFEST))
    assert checkpoint_layout.latest_complete(str(tmp_path))[0] == previous
    assert numbers(tmp_path) == [1, 2]


def test_prune_keeps_the_newest_complete_ones_and_in_progress_ones(tmp_path):
    make_checkpoint(tmp_path, 1)
    make_checkpoint(tmp_path, 2, manifest=False)
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 4)
    make_checkpoint(tmp_path, 5, manifest=False)  # still being written
    (tmp_path / "notes").mkdir()
    assert checkpoint_layout.prune(str(tmp_path), 0) == [str(tmp_path / "ckpt-00000002")]
    assert numbers(tmp_path) == [1, 3, 4, 5]
    assert checkpoint_layout.prune(str(tmp_path), 2) == [str(tmp_path / "ckpt-00000001")]
    assert numbers(tmp_path) == [3, 4, 5]
    assert checkpoint_layout.prune(str(tmp_path), 1) == [str(tmp_path / "ckpt-00000003")]
    assert checkpoint_layout.prune(str(tmp_path), 1) == []
    assert numbers(tmp_path) == [4, 5]
    assert (tmp_path / "notes").is_dir()
    with pytest.raises(ValueError, match="Received: -1"):
        checkpoint_layout.prune(str(tmp_path), -1)


def test_prune_counts_a_checkpoint_with_a_short_shard_as_incomplete(tmp_path):
    make_checkpoint(tmp_path, 1)
    broken = make_checkpoint(tmp_path, 2)
    os.truncate(os.path.join(broken, "ps-0-of-2.ckpt"), 3)
    assert checkpoint_layout.prune(str(tmp_path), 1) == []  # ckpt 1 is the newest complete one
    make_checkpoint(tmp_path, 3)
    assert checkpoint_layout.prune(str(tmp_path), 1) == [str(tmp_path / "ckpt-00000001"), broken]


def test_prune_without_any_complete_checkpoint_removes_nothing(tmp_path):
    make_checkpoint(tmp_path, 1, manifest=False)
    assert checkpoint_layout.prune(str(tmp_path), 1) == []
    assert numbers(tmp_path) == [1]


def test_next_number(tmp_path):
    assert checkpoint_layout.next_number(str(tmp_path / "absent")) == 1
    assert checkpoint_layout.next_number(str(tmp_path)) == 1
    make_checkpoint(tmp_path, 3)
    make_checkpoint(tmp_path, 7, manifest=False)
    assert checkpoint_layout.next_number(str(tmp_path)) == 8
