"""Admission, eviction and row budgets of embedding tables: on one table, across a shard's
tables, through a shard's pulls and pushes, and through checkpoints (also re-sharded)."""

import json

import keras
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from elastic_keras.common import checkpoint_layout
from elastic_keras.common.embedding_init import initial_rows
from elastic_keras.common.embedding_lifecycle import EmbeddingLifecycle
from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.partition import embedding_shards
from elastic_keras.common.transfer.tensor_codec import Slices
from elastic_keras.ps.checkpoint import load_shards, save_shard
from elastic_keras.ps.embedding_table import EmbeddingTable
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push, TableConfig
from elastic_keras.ps.sparse_optimizers import from_keras_config
from elastic_keras.ps.table_lifecycle import (
    IdleClock, Lifecycle, Recency, ShardLifecycle, SightingCounter, evict_over_budget,
)


def adam():
    return from_keras_config({"class_name": "Adam", "config": {"learning_rate": 0.01}})


def table(name="items", dim=4, **lifecycle):
    return EmbeddingTable(name, dim, "uniform", slot_names=adam().slot_names,
                          lifecycle=Lifecycle(**lifecycle))


def ids(*values):
    return np.array(values, dtype=np.int64)


def test_an_id_gets_a_row_on_its_nth_training_lookup_and_reads_zeros_before():
    t = table(admit_after=3)
    for _ in range(2):
        np.testing.assert_array_equal(t.rows(ids(7, 8)), np.zeros((2, 4)))
    assert t.num_rows == 0
    rows = t.rows(ids(7, 9))
    np.testing.assert_array_equal(rows[0], initial_rows("items", ids(7), 4, "uniform")[0])
    np.testing.assert_array_equal(rows[1], 0.0)
    assert t.num_rows == 1
    assert t.counters.as_dict() == {"admitted": 1, "evicted": 0, "not_admitted_lookups": 5,
                                    "dropped_gradients": 0}


def test_gradients_of_ids_without_a_row_are_dropped_and_counted():
    t, optimizer = table(admit_after=2), adam()
    t.rows(ids(1, 2)), t.rows(ids(1))  # 1 admitted on its second sighting, 2 not
    before = t.rows(ids(1), training=False)
    t.apply(ids(1, 2, 3), np.ones((3, 4), np.float32), optimizer, step=1)
    assert t.num_rows == 1 and t.counters.dropped_gradients == 2
    assert np.all(t.rows(ids(1), training=False) < before)  # the admitted row moved


def test_read_only_lookups_change_nothing():
    t = table(admit_after=2)
    for _ in range(5):
        np.testing.assert_array_equal(t.rows(ids(4), training=False), np.zeros((1, 4)))
    t.rows(ids(4))  # the first sighting in training
    assert t.num_rows == 0 and t.counters.not_admitted_lookups == 1
    plain = table()
    np.testing.assert_array_equal(plain.rows(ids(4), training=False),
                                  initial_rows("items", ids(4), 4, "uniform"))
    assert plain.num_rows == 0  # evaluation does not grow a table


def test_probability_admission_admits_about_that_share():
    t = table(admit_probability=0.25)
    t.rows(np.arange(20_000))
    assert 4_500 < t.num_rows < 5_500
    assert t.counters.not_admitted_lookups == 20_000 - t.num_rows


def test_an_evicted_id_must_be_seen_again_to_return():
    t = table(admit_after=2, max_rows=8)
    t.rows(ids(1)), t.rows(ids(1))
    assert t.num_rows == 1
    t.remove(ids(1))
    np.testing.assert_array_equal(t.rows(ids(1)), np.zeros((1, 4)))  # counted anew
    assert t.num_rows == 0
    t.rows(ids(1))
    assert t.num_rows == 1


def test_a_budget_evicts_the_least_recently_used_in_batches_and_never_grows_the_arrays():
    t = table(max_rows=400)
    hot = ids(-1, -2, -3)
    evictions = 0
    for start in range(0, 5000, 10):
        evicted = t.counters.evicted
        t.rows(np.concatenate([hot, np.arange(start, start + 10)]))
        assert t.num_rows <= 400 and t.capacity <= 400
        evictions += t.counters.evicted > evicted
    held = set(t.state().ids.tolist())
    assert set(hot.tolist()) <= held  # used at every step: never the least recent
    assert set(range(4990, 5000)) <= held
    assert t.counters.evicted == t.counters.admitted - t.num_rows
    # Each eviction frees the lookup's 10 rows and an eighth of the budget more.
    assert evictions <= t.counters.evicted // (10 + 400 // 8) + 1


def test_a_budget_below_one_lookup_is_exceeded_not_broken():
    t = table(max_rows=10)
    t.rows(np.arange(5))
    big = np.arange(100, 130)
    rows = t.rows(big)
    np.testing.assert_array_equal(rows, initial_rows("items", big, 4, "uniform"))
    assert sorted(t.state().ids.tolist()) == big.tolist()  # the older five went


def test_evicted_rows_take_their_slots_with_them():
    t, optimizer = table(max_rows=2), adam()
    for step, batch in enumerate(([1, 2], [2], [3], [1, 3]), start=1):
        t.apply(np.array(batch), np.ones((len(batch), 4), np.float32), optimizer, step=step)
    # Step 3 evicted 1 (the least recently used), step 4 brought it back and evicted 2.
    state = t.state()
    assert sorted(state.ids.tolist()) == [1, 3] and t.counters.evicted == 2
    one = state.ids.tolist().index(1)
    fresh = table()  # one Adam step from fresh slots, not two
    fresh.apply(ids(1), np.ones((1, 4), np.float32), optimizer, step=4)
    np.testing.assert_array_equal(state.slots["momentum"][one], fresh.state().slots["momentum"][0])
    np.testing.assert_array_equal(state.values[one], fresh.state().values[0])


def test_idle_rows_go_after_the_idle_steps():
    t, optimizer = table(idle_steps=3), adam()
    t.apply(ids(1, 2), np.ones((2, 4), np.float32), optimizer, step=1)
    for step in range(2, 6):
        t.apply(ids(2), np.ones((1, 4), np.float32), optimizer, step=step)
    assert t.evict(idle_steps=3).tolist() == [1] and t.state().ids.tolist() == [2]
    assert t.counters.evicted == 1


def test_a_shard_budget_evicts_the_least_recently_used_of_any_table():
    users, items, optimizer = table("users"), table("items"), adam()
    users.apply(np.arange(0, 40), np.ones((40, 4), np.float32), optimizer, step=1)
    items.apply(np.arange(0, 40), np.ones((40, 4), np.float32), optimizer, step=2)
    users.apply(np.arange(100, 120), np.ones((20, 4), np.float32), optimizer, step=3)
    gone = evict_over_budget([users, items], 64)
    assert users.num_rows + items.num_rows == 64 - 64 // 8 and gone == 100 - 56
    assert items.num_rows == 36 and set(range(100, 120)) <= set(users.state().ids.tolist())
    assert evict_over_budget([users, items], 64) == 0


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-2**63, 2**63 - 1), min_size=1, max_size=300))
def test_the_sketch_never_counts_an_id_below_its_sightings(seen):
    counter = SightingCounter(16, "t")  # the narrowest sketch: many shared counters
    truth = {}
    for value in seen:
        truth[value] = truth.get(value, 0) + 1
        count = counter.add(ids(value))[0]
        assert count >= min(truth[value], 255)


def test_ids_seen_once_are_rarely_admitted_beside_busy_ones():
    t = table(admit_after=3)
    rng = np.random.default_rng(3)
    head = rng.integers(1, 2**62, 50_000)
    for step in range(60):  # 15k new ids a step beside a Zipf head seen over and over
        hot = np.unique(head[np.minimum(rng.zipf(1.2, 8192), len(head)) - 1])
        t.rows(np.concatenate([hot, -1 - np.arange(step * 15_000, (step + 1) * 15_000)]))
    new_rows = int(np.count_nonzero(t.state().ids < 0))
    assert new_rows < 0.01 * 60 * 15_000, new_rows  # a count-min sketch overcounts a few
    assert np.count_nonzero(t.state().ids > 0) > 1000  # the head is admitted


def test_the_sketch_halves_so_old_sightings_fade():
    counter = SightingCounter(16, "t")
    counter.add(ids(5))
    counter.add(ids(5))
    others = np.arange(1000, 1000 + 4096)  # seen often, in a sixteenth of the counters
    for _ in range(counter.width * 2 // len(others)):
        counter.add(others)
    assert counter.add(ids(5))[0] == 2  # 2 halved, plus this sighting


def test_a_tables_own_settings_take_precedence_over_the_jobs():
    shard = ShardLifecycle(EmbeddingLifecycle(embedding_admit_probability=0.5,
                                              embedding_idle_steps=9, embedding_max_rows=1000),
                           num_ps=3)
    assert shard.of_table(TableConfig("t", 4)) == Lifecycle(0, 0.5, 9, 334)
    own = TableConfig("t", 4, admit_after=4, idle_steps=0, max_rows=10)
    assert shard.of_table(own) == Lifecycle(4, 1.0, 0, 4)


@pytest.mark.parametrize("flags, problem", [
    ({"embedding_admit_probability": 0.0}, "--embedding-admit-probability must be a number in"),
    ({"embedding_admit_after": 256}, "--embedding-admit-after must be an integer from 0 to 255"),
    ({"embedding_admit_after": 3, "embedding_admit_probability": 0.5}, "not both"),
    ({"ps_max_rows_per_shard": -1}, "--ps-max-rows-per-shard must be zero or more"),
    ({"embedding_idle_seconds": float("inf")}, "--embedding-idle-seconds must be a finite"),
])
def test_bad_flags_are_named(flags, problem):
    with pytest.raises(ConfigError, match=problem):
        EmbeddingLifecycle(**flags)


def sgd_config():
    return json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))


def test_init_model_refuses_a_table_whose_lifecycle_breaks_a_rule():
    params = Parameters()
    bad = TableConfig("clicks", 4, admit_after=3, admit_probability=0.5)
    with pytest.raises(PayloadError, match="'clicks'.*not both"):
        params.init_model([], sgd_config(), [bad])
    for seconds in (float("nan"), -5.0, float("inf")):
        with pytest.raises(PayloadError, match="'clicks'.*idle_seconds must be a finite"):
            params.init_model([], sgd_config(), [TableConfig("clicks", 4, idle_seconds=seconds)])
    with pytest.raises(PayloadError, match="max_rows must be an integer from 0"):
        params.init_model([], sgd_config(), [TableConfig("clicks", 4, max_rows=-3)])
    assert not params.initialized


def push_rows(params, sequence, table_ids):
    grads = np.ones((len(table_ids), 4), np.float32)
    return params.push(Push(worker_id=0, sequence=sequence, model_version=params.version,
                            gradients=[("emb", Slices(grads, table_ids, (0, 4)))]))


def test_a_shard_keeps_its_row_budget_through_pulls_and_pushes():
    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(ps_max_rows_per_shard=80)))
    params.init_model([], sgd_config(), [TableConfig("emb", 4), TableConfig("other", 4)])
    for step in range(50):
        batch = np.arange(step * 10, step * 10 + 10)
        params.pull_embeddings([("emb", batch), ("other", batch)])
        push_rows(params, step + 1, batch)
        stats = params.table_stats
        assert stats["emb"]["rows"] + stats["other"]["rows"] <= 80 + 20
    stats = params.table_stats
    assert stats["emb"]["evicted"] + stats["other"]["evicted"] == 1000 - (
        stats["emb"]["rows"] + stats["other"]["rows"])
    assert stats["emb"]["bytes"] > 0


def trained_shard(lifecycle, num_ps=1, ps_id=0):
    params = Parameters(lifecycle=ShardLifecycle(lifecycle, num_ps))
    params.init_model([], sgd_config(), [TableConfig("emb", 4, max_rows=400)])
    for step in range(1, 31):
        batch = np.arange(step * 7, step * 7 + 20)
        batch = batch[embedding_shards("emb", batch, num_ps) == ps_id]
        params.pull_embeddings([("emb", batch)])
        push_rows(params, step, batch)
    return params


def save(path, shards):
    files = [save_shard(params, str(path), i, len(shards)) for i, params in enumerate(shards)]
    checkpoint_layout.write_manifest(str(path), {"number": 1, "num_ps": len(shards),
                                                 "shards": files})


def test_a_checkpoint_keeps_rows_recency_and_counts(tmp_path):
    params = trained_shard(EmbeddingLifecycle(embedding_admit_after=2))
    once = ids(10**12)
    params.pull_embeddings([("emb", once)])  # its first sighting, counted in the checkpoint
    save(tmp_path, [params])
    restored = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(embedding_admit_after=2)))
    restored.restore(load_shards(str(tmp_path), 0, 1))
    original, back = params.snapshot(), restored.snapshot()
    for name in ("ids", "values", "touched"):
        np.testing.assert_array_equal(getattr(back.table_states["emb"], name),
                                      getattr(original.table_states["emb"], name))
    assert back.table_counters == original.table_counters
    assert back.table_counters["emb"]["admitted"] > 0
    np.testing.assert_array_equal(back.table_sketches["emb"], original.table_sketches["emb"])
    # Restored, it admits and evicts what the original does: the id seen once before the
    # checkpoint gets its row at its next sighting.
    for shard in (params, restored):
        assert shard.pull_embeddings([("emb", once)])[0]["emb"].any()
    a = params._model.tables["emb"].evict(max_rows=10)
    b = restored._model.tables["emb"].evict(max_rows=10)
    assert sorted(a.tolist()) == sorted(b.tolist())


def test_a_resharded_restore_keeps_recency_counts_and_splits_the_budget(tmp_path):
    shards = [trained_shard(EmbeddingLifecycle(), 2, i) for i in range(2)]
    save(tmp_path, shards)
    one = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(), 1))
    one.restore(load_shards(str(tmp_path), 0, 1))
    merged = one.snapshot().table_states["emb"]
    by_id = dict(zip(merged.ids.tolist(), merged.touched.tolist()))
    for params in shards:
        state = params.snapshot().table_states["emb"]
        assert all(by_id[i] == t for i, t in zip(state.ids.tolist(), state.touched.tolist()))
    total = sum(p.table_stats["emb"]["admitted"] for p in shards)
    assert one.table_stats["emb"]["admitted"] == total
    assert one._model.tables["emb"].lifecycle.max_rows == 400
    assert shards[0]._model.tables["emb"].lifecycle.max_rows == 200


def test_a_shard_evicts_rows_idle_for_its_idle_steps_as_it_applies_updates():
    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(embedding_idle_steps=8)))
    params.init_model([], sgd_config(), [TableConfig("emb", 4)])
    push_rows(params, 1, ids(1, 2))
    for step in range(2, 20):
        push_rows(params, step, ids(2, 100 + step))
    held = set(params.snapshot().table_states["emb"].ids.tolist())
    assert 1 not in held and 2 in held and 119 in held
    assert not {102, 103, 104, 105, 106, 107, 108, 109} & held  # idle for more than 9 steps
    stats = params.table_stats["emb"]
    assert stats["admitted"] == 20 and stats["evicted"] == 20 - len(held)


def test_recency_outlives_its_four_bytes():
    recency = Recency(np.array([5, 7]), step=7, count=2)
    recency.mark(np.array([1]), 3 << 31)  # a table billions of steps old
    assert recency.of(np.array([0, 1])).tolist() == [recency.base, 3 << 31]
    assert recency.steps.dtype == np.uint32 and recency.base > 0
    recency.mark(np.array([0]), (3 << 31) + 1)
    assert recency.of(np.array([0, 1])).tolist() == [(3 << 31) + 1, 3 << 31]


def test_over_grpc_a_tables_own_admission_holds_and_inference_pulls_change_nothing():
    from elastic_keras.common import rpc
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(embedding_admit_after=5)))
    servicer = PServerServicer(params)
    server, port = rpc.create_server([lambda s: add_to_server(servicer, s)])
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    try:
        client.init_model({"bias": np.zeros(1, np.float32)}, sgd_config(), [
            pserver_pb2.EmbeddingTableSpec(name="emb", dim=4, initializer="uniform",
                                           admit_after=2),
            pserver_pb2.EmbeddingTableSpec(name="free", dim=4, initializer="uniform")])
        for _ in range(3):
            client.pull_embeddings({"emb": ids(1, 2), "free": ids(1)}, read_only=True)
        assert params.table_stats["emb"]["rows"] == params.table_stats["free"]["rows"] == 0
        client.pull_embeddings({"emb": ids(1), "free": ids(1)})
        rows = client.pull_embeddings({"emb": ids(1, 2), "free": ids(1)})
        np.testing.assert_array_equal(rows["emb"][0],
                                      initial_rows("emb", ids(1), 4, "uniform")[0])
        np.testing.assert_array_equal(rows["emb"][1], 0.0)  # seen once in training
        np.testing.assert_array_equal(rows["free"], 0.0)  # the job's admit_after 5
        stats = params.table_stats
        assert (stats["emb"]["rows"], stats["emb"]["not_admitted_lookups"]) == (1, 2)
        assert (stats["free"]["rows"], stats["free"]["not_admitted_lookups"]) == (0, 2)
    finally:
        client.close()
        server.stop(0)


def test_a_restored_table_keeps_its_policy_and_says_so_when_asked_for_another(
        tmp_path, caplog):
    from elastic_keras.common import rpc
    from elastic_keras.common.ps_client import PSClient
    from elastic_keras.proto import pserver_pb2
    from elastic_keras.ps.servicer import PServerServicer, add_to_server

    save(tmp_path, [trained_shard(EmbeddingLifecycle())])
    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle()))
    params.restore(load_shards(str(tmp_path), 0, 1))
    servicer = PServerServicer(params)
    server, port = rpc.create_server([lambda s: add_to_server(servicer, s)])
    client = PSClient([f"127.0.0.1:{port}"], deadline_s=30)
    spec = pserver_pb2.EmbeddingTableSpec(name="emb", dim=4, initializer="uniform",
                                          max_rows=50)
    try:
        with caplog.at_level("WARNING", logger="elastic_keras.ps.servicer"):
            for _ in range(3):  # as each worker's InitModel does
                client.init_model({}, sgd_config(), [spec])
    finally:
        client.close()
        server.stop(0)
    warnings = [r.getMessage() for r in caplog.records if "keeps the policy" in r.getMessage()]
    assert len(warnings) == 1 and "400" in warnings[0] and "50" in warnings[0], warnings
    assert params.table_lifecycles["emb"].max_rows == 400


class FakeTime:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_the_idle_clock_tells_the_step_of_so_many_seconds_ago():
    now = FakeTime()
    clock = IdleClock(100, clock=now)
    assert clock.tick(1) and not clock.tick(2)  # the next sample a sixteenth later
    now.now += 10
    assert clock.tick(5) and clock.idle_steps(5) is None  # nothing 100 s old yet
    now.now += 95
    assert clock.tick(9)
    assert clock.idle_steps(9) == 9 - 1 - 1  # rows last used at step 1 or before
    now.now += 10_000
    clock.tick(40)
    assert clock.idle_steps(40) == 40 - 9 - 1 and len(clock._samples) <= 3


def test_a_shard_evicts_rows_idle_for_so_many_seconds(monkeypatch):
    from elastic_keras.ps import table_lifecycle

    now = FakeTime()
    monkeypatch.setattr(table_lifecycle.time, "monotonic", now)
    params = Parameters()
    params.init_model([], sgd_config(), [TableConfig("emb", 4, idle_seconds=60.0)])
    push_rows(params, 1, ids(1, 2))
    for step in range(2, 40):
        now.now += 5
        push_rows(params, step, ids(2))
    held = params.snapshot().table_states["emb"].ids.tolist()
    assert held == [2] and params.table_stats["emb"]["evicted"] == 1


def test_every_table_keeps_the_shards_step_whatever_each_push_touches():
    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(embedding_idle_steps=8)))
    params.init_model([], sgd_config(), [TableConfig("emb", 4), TableConfig("rare", 4)])
    grads = np.ones((2, 4), np.float32)
    params.push(Push(worker_id=0, sequence=1, model_version=0, gradients=[
        ("rare", Slices(grads, ids(1, 2), (0, 4)))]))
    for step in range(2, 30):
        params.pull_embeddings([("rare", ids(2))])  # 2 is used every step, never pushed
        push_rows(params, step, ids(7))
    assert params.snapshot().table_states["rare"].ids.tolist() == [2]  # 1 went, idle


def test_rows_used_now_are_not_the_oldest_under_a_shard_budget():
    params = Parameters(lifecycle=ShardLifecycle(EmbeddingLifecycle(ps_max_rows_per_shard=40)))
    params.init_model([], sgd_config(), [TableConfig("emb", 4), TableConfig("hot", 4)])
    hot = np.arange(1000, 1010)
    for step in range(1, 30):
        params.pull_embeddings([("hot", hot), ("emb", np.arange(step * 10, step * 10 + 10))])
        push_rows(params, step, np.arange(step * 10, step * 10 + 10))  # "emb" only
    assert params.table_stats["hot"] == {**params.table_stats["hot"], "rows": 10, "evicted": 0}


def test_a_state_whose_last_uses_lie_after_its_step_is_refused():
    from elastic_keras.common.errors import DataError

    with pytest.raises(DataError, match="last uses must be 2 steps from 0 to 5"):
        EmbeddingTable.from_state("t", "zeros", ids(1, 2), np.zeros((2, 4), np.float32),
                                  touched=np.array([3, 9]), step=5)
