"""Shard checkpoints: save, restore, re-shard, the SaveCheckpoint RPC and `--restore-from`."""

import json
import logging
import os
import threading

import grpc
import keras
import numpy as np
import pytest

from elastic_keras.common.exit_codes import RoleExitCode
from elastic_keras.common import checkpoint_layout
from elastic_keras.common import partition, rpc
from elastic_keras.common.transfer import tensor_codec, tensor_stream
from elastic_keras.common.config import PSConfig, parse_argv
from elastic_keras.common.errors import CheckpointError, NotReadyError, PSError
from elastic_keras.common.ps_client import PSClient
from elastic_keras.proto import pserver_pb2
from elastic_keras.ps import main as ps_main
from elastic_keras.ps.checkpoint import load_shards, save_shard
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.servicer import PServerServicer, add_to_server
from elastic_keras.ps.shard_types import DUPLICATE, Push, TableConfig
from tests.credentials import job_keys

DIM = 3
TABLES = (TableConfig("user", DIM), TableConfig("item", 2, input_dim=1000))
SHAPES = {"dense/kernel": (4, 3), "dense/bias": (3,), "out/kernel": (3, 1), "out/bias": (1,),
          "norm/gamma": (3,), "norm/beta": (3,)}
OPTIMIZERS = {
    "sgd_momentum": lambda: keras.optimizers.SGD(0.1, momentum=0.9),
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adam_schedule": lambda: keras.optimizers.Adam(
        keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=2, decay_rate=0.5)),
    "adagrad": lambda: keras.optimizers.Adagrad(0.1),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01, momentum=0.5, centered=True),
}


def optimizer_config(name):
    return json.dumps(keras.optimizers.serialize(OPTIMIZERS[name]()))


def initial_values(names=SHAPES, seed=0):
    rng = np.random.default_rng(seed)
    values = {name: rng.standard_normal(SHAPES[name]).astype(np.float32) for name in names}
    values["steps"] = np.array(seed, np.int64)
    return values


def new_shard(values, optimizer="adam"):
    parameters = Parameters()
    assert parameters.init_model(list(values.items()), optimizer_config(optimizer), TABLES) \
        .initialized_now
    return parameters


def make_push(rng, sequence, dense_names, worker_id=0, table_ids=None, assign=True):
    """A push with gradients for `dense_names` and rows of both tables (random ids), and,
    with `assign`, a delta of the non-trainable "steps"."""
    gradients = [(n, rng.standard_normal(SHAPES[n]).astype(np.float32)) for n in dense_names]
    for table in TABLES:
        ids = table_ids[table.name] if table_ids else rng.choice(50, 6, replace=False)
        rows = rng.standard_normal((len(ids), table.dim)).astype(np.float32)
        gradients.append((table.name, tensor_codec.Slices(rows, ids, (0, table.dim))))
    steps = (("steps", np.array(sequence, np.int64)),) if assign else ()
    return Push(worker_id=worker_id, sequence=sequence, gradients=tuple(gradients),
                deltas=steps)


def train(parameters, seed, steps, first_sequence=1, names=SHAPES):
    rng = np.random.default_rng(seed)
    for i in range(steps):
        names_now = [n for n in names if n in SHAPES]
        assert parameters.push(make_push(rng, first_sequence + i, names_now, worker_id=i % 2))\
            .accepted


def state_of(parameters):
    """Everything observable: dense values, versions and every table row."""
    snapshot = parameters.snapshot()
    rows = {name: parameters.pull_embeddings([(name, np.arange(60))])[0][name]
            for name in snapshot.table_states}
    return snapshot, rows


def assert_same_state(actual, expected):
    (snapshot, rows), (expected_snapshot, expected_rows) = actual, expected
    assert snapshot.version == expected_snapshot.version
    assert snapshot.table_steps == expected_snapshot.table_steps
    assert snapshot.optimizer_iterations == expected_snapshot.optimizer_iterations
    assert snapshot.applied_sequences == expected_snapshot.applied_sequences
    assert_arrays_equal(snapshot.dense, expected_snapshot.dense)
    assert snapshot.optimizer_slots.keys() == expected_snapshot.optimizer_slots.keys()
    for name, slots in expected_snapshot.optimizer_slots.items():
        assert_arrays_equal(snapshot.optimizer_slots[name], slots)
    assert_arrays_equal(rows, expected_rows)
    for name, state in expected_snapshot.table_states.items():
        restored = snapshot.table_states[name]
        order, expected_order = np.argsort(restored.ids), np.argsort(state.ids)
        np.testing.assert_array_equal(restored.ids[order], state.ids[expected_order])
        np.testing.assert_array_equal(restored.values[order], state.values[expected_order])
        assert restored.slots.keys() == state.slots.keys()
        for slot in state.slots:
            np.testing.assert_array_equal(restored.slots[slot][order],
                                          state.slots[slot][expected_order])


def assert_arrays_equal(actual, expected):
    assert actual.keys() == expected.keys()
    for name in expected:
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)
        assert actual[name].dtype == expected[name].dtype, name


def write_checkpoint(path, shard_files, number=1):
    checkpoint_layout.write_manifest(path, {"number": number, "num_ps": len(shard_files),
                                 "shards": shard_files})


def save_one(parameters, tmp_path, number=1):
    path = checkpoint_layout.checkpoint_path(str(tmp_path), number)
    write_checkpoint(path, [save_shard(parameters, path, 0, 1)], number)
    return path


@pytest.mark.parametrize("optimizer", sorted(OPTIMIZERS))
def test_restored_shard_makes_bit_identical_next_updates(tmp_path, optimizer):
    uninterrupted = new_shard(initial_values(), optimizer)
    train(uninterrupted, seed=1, steps=4)
    path = save_one(uninterrupted, tmp_path)

    restored = Parameters()
    restored.restore(load_shards(path, 0, 1))
    assert_same_state(state_of(restored), state_of(uninterrupted))
    # Optimizer slots and the step count (Adam's bias correction, the schedule) are restored.
    assert any(np.any(slot) for slots in restored.snapshot().optimizer_slots.values()
               for slot in slots.values())
    assert restored.snapshot().optimizer_iterations == 4

    for parameters in (uninterrupted, restored):
        train(parameters, seed=2, steps=3, first_sequence=5)
    assert_same_state(state_of(restored), state_of(uninterrupted))


def test_restore_keeps_sequences_and_a_later_init_model_keeps_the_state(tmp_path):
    original = new_shard(initial_values(), "sgd_momentum")
    train(original, seed=1, steps=3)  # workers 0 and 1 pushed sequences 1..3
    restored = Parameters()
    restored.restore(load_shards(save_one(original, tmp_path), 0, 1))
    assert restored.version == 3
    assert restored.snapshot().applied_sequences == {0: 3, 1: 2}
    init = restored.init_model(list(initial_values(seed=9).items()),
                               optimizer_config("sgd_momentum"), TABLES)
    assert not init.initialized_now and init.model_version == 3
    assert_arrays_equal(restored.pull().dense, original.pull().dense)
    duplicate = restored.push(make_push(np.random.default_rng(3), 2, ["out/bias"], worker_id=1))
    assert duplicate.reason == DUPLICATE and restored.version == 3


def test_restore_into_an_initialised_shard_is_refused(tmp_path):
    original = new_shard(initial_values())
    path = save_one(original, tmp_path)
    with pytest.raises(PSError, match="already holds a model at version 0"):
        original.restore(load_shards(path, 0, 1))


def test_snapshot_and_save_need_a_model(tmp_path):
    with pytest.raises(NotReadyError, match="InitModel must come first"):
        save_shard(Parameters(), str(tmp_path), 0, 1)
    assert not os.listdir(tmp_path)


def test_shard_file_is_a_pickle_free_npz_with_its_crc(tmp_path):
    parameters = new_shard(initial_values())
    train(parameters, seed=1, steps=1)
    path = str(tmp_path / "ckpt-00000001")  # created by save_shard
    shard = save_shard(parameters, path, 1, 2)
    file = os.path.join(path, "ps-1-of-2.ckpt")
    assert shard.file == "ps-1-of-2.ckpt" and shard.model_version == 1
    assert checkpoint_layout.file_crc32c(file) == (shard.crc32c, shard.bytes)
    assert os.listdir(path) == ["ps-1-of-2.ckpt"]
    with np.load(file, allow_pickle=False) as archive:
        meta = json.loads(archive["meta.json"])
        assert meta["version"] == 1 and meta["ps_id"] == 1 and meta["num_ps"] == 2
        np.testing.assert_array_equal(archive[meta["dense"]["dense/bias"]],
                                      parameters.pull().dense["dense/bias"])


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_shard_file_is_reported_by_name(tmp_path, damage):
    path = save_one(new_shard(initial_values()), tmp_path)
    file = os.path.join(path, "ps-0-of-1.ckpt")
    if damage == "truncate":
        os.truncate(file, os.path.getsize(file) - 100)
    else:
        with open(file, "r+b") as f:
            f.seek(os.path.getsize(file) // 2)
            byte = f.read(1)[0]
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte ^ 0xFF]))
    with pytest.raises(CheckpointError, match=f"Shard file {file} is truncated or corrupt"):
        load_shards(path, 0, 1)


def test_a_checkpoint_without_manifest_cannot_be_loaded(tmp_path):
    path = str(tmp_path / "ckpt-00000001")
    save_shard(new_shard(initial_values()), path, 0, 1)
    with pytest.raises(CheckpointError, match="MANIFEST.json does not exist"):
        load_shards(path, 0, 1)


def sharded_job(tmp_path, num_ps, optimizer="adam"):
    """`num_ps` trained shards holding the parts of one model the partition gives them.

    Returns:
        (checkpoint path, the shards' snapshots).
    """
    values = initial_values()
    shards = [new_shard(part, optimizer) for part in partition.split_dense(values, num_ps)]
    rng = np.random.default_rng(5)
    for sequence in range(1, 4 + num_ps):
        ids = {t.name: rng.choice(100, 20, replace=False) for t in TABLES}
        for ps_id, shard in enumerate(shards):
            names = [n for n in SHAPES if partition.dense_shard(n, num_ps) == ps_id]
            owned = {t: i[partition.embedding_shards(t, i, num_ps) == ps_id]
                     for t, i in ids.items()}
            if sequence > 3 + ps_id:  # shards see different numbers of steps
                continue
            holds_steps = partition.dense_shard("steps", num_ps) == ps_id
            assert shard.push(make_push(rng, sequence, names, worker_id=sequence % 2,
                                        table_ids=owned, assign=holds_steps)).accepted
    path = checkpoint_layout.checkpoint_path(str(tmp_path), 4)
    write_checkpoint(path, [save_shard(s, path, i, num_ps) for i, s in enumerate(shards)], 4)
    return path, [s.snapshot() for s in shards]


@pytest.mark.parametrize("old, new", [(2, 3), (3, 1)])
def test_re_sharding_keeps_every_value_and_row_with_its_slots_exactly_once(tmp_path, old, new):
    path, sources = sharded_job(tmp_path, old)
    loaded = [load_shards(path, ps_id, new) for ps_id in range(new)]

    dense = [name for snapshot in loaded for name in snapshot.dense]
    assert sorted(dense) == sorted(name for s in sources for name in s.dense)
    for ps_id, snapshot in enumerate(loaded):
        assert all(partition.dense_shard(n, new) == ps_id for n in snapshot.dense)
        assert snapshot.version == max(s.version for s in sources)
        assert snapshot.table_steps == max(s.table_steps for s in sources)
        assert snapshot.optimizer_iterations == max(s.optimizer_iterations for s in sources)
        assert snapshot.applied_sequences == _merged_sequences(sources)
    source_dense = {n: v for s in sources for n, v in s.dense.items()}
    source_slots = {n: v for s in sources for n, v in s.optimizer_slots.items()}
    for snapshot in loaded:
        assert_arrays_equal(snapshot.dense, {n: source_dense[n] for n in snapshot.dense})
        for name, slots in snapshot.optimizer_slots.items():
            assert_arrays_equal(slots, source_slots[name])
        assert snapshot.optimizer_slots.keys() == {
            n for n, v in snapshot.dense.items() if v.dtype.kind == "f"}

    for table in TABLES:
        expected = rows_by_id([s.table_states[table.name] for s in sources])
        restored = rows_by_id([s.table_states[table.name] for s in loaded])
        assert len(expected) >= 20 and restored.keys() == expected.keys()
        for row_id, (row, slots) in expected.items():
            np.testing.assert_array_equal(restored[row_id][0], row)
            assert_arrays_equal(restored[row_id][1], slots)
        for ps_id, snapshot in enumerate(loaded):
            ids = snapshot.table_states[table.name].ids
            assert np.all(partition.embedding_shards(table.name, ids, new) == ps_id)

    for snapshot in loaded:  # each new shard starts from its part
        shard = Parameters()
        shard.restore(snapshot)
        assert_arrays_equal(shard.pull().dense, snapshot.dense)


def _merged_sequences(sources):
    merged = {}
    for snapshot in sources:
        for worker, sequence in snapshot.applied_sequences.items():
            merged[worker] = max(merged.get(worker, 0), sequence)
    return merged


def rows_by_id(states):
    """`{id: (row, {slot: row})}` over table states, failing on an id held twice."""
    rows = {}
    for state in states:
        for i, row_id in enumerate(state.ids.tolist()):
            assert row_id not in rows, f"row {row_id} is held twice"
            rows[row_id] = (state.values[i], {s: a[i] for s, a in state.slots.items()})
    return rows


def test_re_sharding_rejects_files_of_different_jobs(tmp_path):
    path = checkpoint_layout.checkpoint_path(str(tmp_path), 1)
    files = [save_shard(new_shard(initial_values(), "adam"), path, 0, 2),
             save_shard(new_shard(initial_values(), "adagrad"), path, 1, 2)]
    write_checkpoint(path, files)
    with pytest.raises(CheckpointError, match="ps-1-of-2.ckpt was written with another"):
        load_shards(path, 0, 1)


@pytest.fixture
def serve(tmp_path):
    """Starts a real shard server on 127.0.0.1 that checkpoints into `tmp_path/ckpts`:
    `serve(ps_id, num_ps) -> (parameters, address)`."""
    servers = []

    def start(ps_id=0, num_ps=2, checkpoint_dir=str(tmp_path / "ckpts")):
        parameters = Parameters()
        servicer = PServerServicer(parameters, ps_id=ps_id, num_ps=num_ps,
                                   checkpoint_dir=checkpoint_dir)
        server, port = rpc.create_server(
            [lambda s: add_to_server(servicer, s)])
        servers.append(server)
        return parameters, f"127.0.0.1:{port}"

    yield start
    for server in servers:
        server.stop(0)


def save_rpc(address, checkpoint_id, num_ps, **fields):
    channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30)
    try:
        request = pserver_pb2.SaveCheckpointRequest(checkpoint_id=checkpoint_id, num_ps=num_ps,
                                                    without_cut=True, **fields)
        return rpc.Stub(channel, tensor_stream.PSERVER).SaveCheckpoint(request)
    finally:
        channel.close()


def test_save_checkpoint_rpc_writes_the_shard_file(serve, tmp_path):
    parameters, address = serve(ps_id=1)
    with pytest.raises(grpc.RpcError) as info:
        save_rpc(address, 2, 2)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "InitModel must come first" in info.value.details()

    parameters.init_model(list(initial_values().items()), optimizer_config("adam"), TABLES)
    train(parameters, seed=1, steps=2)
    response = save_rpc(address, 2, 2)
    assert (response.file, response.model_version) == ("ps-1-of-2.ckpt", 2)
    file = os.path.join(checkpoint_layout.checkpoint_path(str(tmp_path / "ckpts"), 2),
                        response.file)
    assert checkpoint_layout.file_crc32c(file) == (response.crc32c, response.bytes)


@pytest.mark.parametrize("checkpoint_id, num_ps, message", [
    (0, 2, "checkpoint number, 1 or more. Received: checkpoint_id=0"),
    (-5, 2, "Received: checkpoint_id=-5"),
    (1, 1, "num_ps must be the job's 2. Received: num_ps=1"),
    (1, 2**31 - 1, "Received: num_ps=2147483647"),
])
def test_save_checkpoint_rpc_rejects_bad_requests(serve, tmp_path, checkpoint_id, num_ps,
                                                  message):
    parameters, address = serve(ps_id=1)
    parameters.init_model(list(initial_values().items()), optimizer_config("adam"))
    with pytest.raises(grpc.RpcError) as info:
        save_rpc(address, checkpoint_id, num_ps)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert message in info.value.details()
    assert not (tmp_path / "ckpts").exists()


def test_save_checkpoint_rpc_writes_nowhere_but_its_checkpoint_dir(serve, tmp_path):
    """The request names a checkpoint, never a path: a caller cannot pick where a shard
    writes (the field that once held a path is reserved; set anyway, it is ignored)."""
    parameters, address = serve(ps_id=0, num_ps=1)
    parameters.init_model(list(initial_values().items()), optimizer_config("adam"))
    request = pserver_pb2.SaveCheckpointRequest(checkpoint_id=7, num_ps=1, without_cut=True)
    elsewhere = tmp_path / "elsewhere"
    # Field 1 was `string path`: its bytes on the wire are unknown to today's message.
    wire = b"\n" + bytes([len(str(elsewhere))]) + str(elsewhere).encode() + \
        request.SerializeToString()
    channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30)
    try:
        stub = rpc.Stub(channel, tensor_stream.PSERVER)
        stub.SaveCheckpoint(pserver_pb2.SaveCheckpointRequest.FromString(wire))
    finally:
        channel.close()
    assert not elsewhere.exists()
    assert os.listdir(tmp_path / "ckpts") == ["ckpt-00000007"]


def test_save_checkpoint_rpc_needs_a_checkpoint_dir(serve):
    parameters, address = serve(ps_id=0, num_ps=1, checkpoint_dir="")
    parameters.init_model(list(initial_values().items()), optimizer_config("adam"))
    with pytest.raises(grpc.RpcError) as info:
        save_rpc(address, 1, 1)
    assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "started without --checkpoint-dir" in info.value.details()


def test_save_checkpoint_rpc_reports_a_failed_write_as_internal(serve, tmp_path):
    (tmp_path / "a_file").write_text("")
    parameters, address = serve(num_ps=1, checkpoint_dir=str(tmp_path / "a_file"))
    parameters.init_model(list(initial_values().items()), optimizer_config("adam"))
    with pytest.raises(grpc.RpcError) as info:
        save_rpc(address, 1, 1)
    assert info.value.code() == grpc.StatusCode.INTERNAL
    assert str(tmp_path / "a_file" / "ckpt-00000001") in info.value.details()


def test_ps_client_saves_every_shard_into_a_loadable_checkpoint(serve, tmp_path):
    root = str(tmp_path / "ckpts")
    shards = [serve(ps_id) for ps_id in range(2)]
    client = PSClient([address for _, address in shards], deadline_s=30)
    try:
        client.init_model(initial_values(), optimizer_config("sgd_momentum"))
        number = checkpoint_layout.next_number(root)
        responses = client.save_checkpoint(number, without_cut=True)
    finally:
        client.close()
    assert [r.file for r in responses] == ["ps-0-of-2.ckpt", "ps-1-of-2.ckpt"]
    path = checkpoint_layout.checkpoint_path(root, number)
    write_checkpoint(path, [checkpoint_layout.ShardFile(r.file, r.bytes, r.crc32c, r.model_version)
                            for r in responses])
    assert checkpoint_layout.latest_complete(root)[0] == path
    whole = load_shards(path, 0, 1)
    assert_arrays_equal(whole.dense, initial_values())


def test_run_restores_before_serving_and_registering(tmp_path, monkeypatch, caplog):
    original = new_shard(initial_values(), "adam")
    train(original, seed=1, steps=2)
    path = save_one(original, tmp_path)
    keys = job_keys(tmp_path)
    config = parse_argv(PSConfig, ["--ps-id", "0", "--num-ps", "1", "--master-addr",
                                   "127.0.0.1:1", "--restore-from", path,
                                   "--secret-file", keys.secret_file])
    seen = {}

    def keep_in_touch(config, address, parameters, master, stop, wire):
        # What a worker finds once the shard has registered: the restored model.
        channel = rpc.create_channel(address, "elastic_keras.PServer", deadline_s=30,
                                     token=keys.token("worker", 0))
        stub = rpc.Stub(channel, tensor_stream.PSERVER)
        seen["init"] = stub.InitModel(pserver_pb2.InitModelRequest(
            dense=[tensor_codec.encode(n, v) for n, v in initial_values(seed=3).items()],
            optimizer_config=optimizer_config("adam")))
        pulled = stub.PullDense(pserver_pb2.PullDenseRequest(known_version=-1))
        seen["dense"] = {t.name: tensor_codec.decode(t) for t in pulled.dense}
        channel.close()
        return 0

    monkeypatch.setattr(ps_main, "_keep_in_touch", keep_in_touch)
    with caplog.at_level(logging.INFO):
        assert ps_main.run(config, threading.Event()) == 0
    assert not seen["init"].initialized_now and seen["init"].model_version == 2
    assert_arrays_equal(seen["dense"], original.pull().dense)
    assert f"Restored shard 0 of 1 from {path}" in caplog.text
    assert "model version 2, 7 dense variables" in caplog.text
    for name, state in original.snapshot().table_states.items():
        assert f"'{name}': {len(state.ids)}" in caplog.text


def test_run_exits_2_when_the_checkpoint_cannot_be_restored(tmp_path, monkeypatch, caplog):
    path = save_one(new_shard(initial_values()), tmp_path)
    os.remove(os.path.join(path, "ps-0-of-1.ckpt"))
    monkeypatch.setattr(ps_main, "_keep_in_touch",
                        lambda *args: pytest.fail("a bad checkpoint must stop the start-up"))
    config = PSConfig(ps_id=0, num_ps=1, master_addr="127.0.0.1:1", restore_from=path,
                      secret_file=job_keys(tmp_path).secret_file)
    assert ps_main.run(config, threading.Event()) == RoleExitCode.BAD_INPUT == 2
    assert f"Cannot restore shard 0 of 1 from --restore-from {path}" in caplog.text
    assert "ps-0-of-1.ckpt cannot be read" in caplog.text
