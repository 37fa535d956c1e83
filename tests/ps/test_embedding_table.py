import numpy as np
import pytest

from elastic_keras.common.embedding_init import initial_rows
from elastic_keras.common.errors import DataError, ModelSpecError, PayloadError
from elastic_keras.ps.embedding_table import EmbeddingTable
from elastic_keras.ps.sparse_optimizers import from_keras_config

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


def adam():
    return from_keras_config({"class_name": "Adam", "config": {"learning_rate": 0.01}})


def adam_table(name="items", dim=4, **kwargs):
    optimizer = adam()
    return EmbeddingTable(name, dim, "uniform", slot_names=optimizer.slot_names, **kwargs)


def test_rows_are_created_on_first_lookup_with_the_initializer():
    table = adam_table()
    ids = np.array([INT64_MAX, -1, 0, INT64_MIN, -1])
    rows = table.rows(ids)
    assert rows.shape == (5, 4) and rows.dtype == np.float32
    np.testing.assert_array_equal(rows, initial_rows("items", ids, 4, "uniform"))
    assert table.num_rows == 4
    state = table.state()
    assert sorted(state.ids.tolist()) == [INT64_MIN, -1, 0, INT64_MAX]
    np.testing.assert_array_equal(state.values, table.rows(state.ids))
    assert (state.slots["momentum"] == 0).all() and (state.slots["velocity"] == 0).all()
    assert table.rows(np.array([[0, 1], [1, 0]])).shape == (2, 2, 4)
    assert table.num_rows == 5


def test_rows_returns_a_copy():
    table = adam_table()
    rows = table.rows(np.array([3]))
    rows += 1
    assert not np.array_equal(table.rows(np.array([3])), rows)


def test_slot_initial_values_come_from_the_optimizer():
    adagrad = from_keras_config({"class_name": "Adagrad",
                                 "config": {"initial_accumulator_value": 0.25}})
    table = EmbeddingTable("t", 3, "zeros", slot_names=adagrad.slot_names,
                           slot_initial_values={"accumulator": 0.25})
    table.rows(np.arange(5))
    assert (table.state().slots["accumulator"] == 0.25).all()


def test_apply_changes_only_the_touched_rows_and_their_slots():
    table, optimizer = adam_table(), adam()
    table.rows(np.arange(10))
    before = table.state()
    table.apply(np.array([2, 7]), np.ones((2, 4)), optimizer, step=1)
    after = table.state()
    changed = np.flatnonzero((after.values != before.values).any(axis=1))
    assert changed.tolist() == [2, 7]
    for name in ("momentum", "velocity"):
        assert np.flatnonzero(after.slots[name].any(axis=1)).tolist() == [2, 7]


def test_apply_creates_rows_it_has_not_seen():
    table = EmbeddingTable("t", 2, "zeros")
    sgd = from_keras_config({"class_name": "SGD", "config": {"learning_rate": 0.5}})
    table.apply(np.array([11, 11, 12]), np.array([[1, 2], [3, 4], [1, 1]]), sgd, step=1)
    np.testing.assert_array_equal(table.rows(np.array([11, 12])), [[-2, -3], [-0.5, -0.5]])


@pytest.mark.parametrize("ids, grads, message", [
    (np.array([1, 2]), np.ones((3, 4)),
     r"shape \[number of ids, dim\] = \[2, 4\]. Received: shape=\[3, 4\]"),
    (np.array([1, 2]), np.ones((2, 5)), r"Received: shape=\[2, 5\]"),
    (np.array([1, 2]), np.ones(8), r"Received: shape=\[8\]"),
    (np.array([[1, 2]]), np.ones((2, 4)), "must be 1-D"),
    (np.array([1.5, 2]), np.ones((2, 4)), "must be integers"),
    (np.array([1, 2]), np.full((2, 4), "x"), "castable to float32"),
    (np.array([1, 2]), np.ones((2, 4), np.complex64), "castable to float32"),
])
def test_bad_gradients_are_refused_before_anything_changes(ids, grads, message):
    table, optimizer = adam_table(), adam()
    table.rows(np.array([1]))
    before = table.state()
    with pytest.raises(PayloadError, match=f"Table 'items': .*{message}"):
        table.apply(ids, grads, optimizer, step=1)
    after = table.state()
    assert table.num_rows == 1
    np.testing.assert_array_equal(after.values, before.values)


def test_a_bounded_table_refuses_ids_outside_input_dim():
    table = EmbeddingTable("bounded", 3, "glorot_uniform", input_dim=100)
    assert table.rows(np.array([0, 99])).shape == (2, 3)
    for bad in (100, -1, INT64_MAX):
        with pytest.raises(PayloadError, match=rf"\[0, 100\). Received: id {bad}"):
            table.rows(np.array([5, bad]))
        sgd = from_keras_config({"class_name": "SGD", "config": {}})
        with pytest.raises(PayloadError, match="input_dim"):
            table.apply(np.array([bad]), np.ones((1, 3)), sgd, step=1)
    assert table.num_rows == 2


def test_an_optimizer_needing_slots_the_table_lacks_is_refused():
    table = EmbeddingTable("t", 2, "zeros", slot_names=("momentum",))
    with pytest.raises(ValueError, match="velocity"):
        table.apply(np.array([1]), np.ones((1, 2)), adam(), step=1)


def test_constructor_checks():
    with pytest.raises(ModelSpecError, match="input_dim"):
        EmbeddingTable("t", 2, "he_normal")
    with pytest.raises(ValueError, match="dim"):
        EmbeddingTable("t", 0, "zeros")
    with pytest.raises(ValueError, match="floating"):
        EmbeddingTable("t", 2, "zeros", dtype=np.int32)
    with pytest.raises(ValueError, match="slot"):
        EmbeddingTable("t", 2, "zeros", slot_names=("a",), slot_initial_values={"b": 1.0})


def test_export_yields_every_row_in_chunks():
    table = adam_table(dim=3)
    ids = np.arange(-500, 500) * 31
    table.rows(ids)
    chunks = list(table.export(chunk_rows=300))
    assert [len(i) for i, _ in chunks] == [300, 300, 300, 100]
    exported_ids = np.concatenate([i for i, _ in chunks])
    exported_rows = np.concatenate([r for _, r in chunks])
    np.testing.assert_array_equal(exported_ids, ids)
    np.testing.assert_array_equal(exported_rows, table.rows(ids))
    assert list(EmbeddingTable("empty", 3, "zeros").export()) == []


def test_state_round_trips_and_accepts_a_subset():
    table, optimizer = adam_table(), adam()
    ids = np.arange(3000) * 7 - 9000
    table.apply(ids, np.random.default_rng(0).normal(size=(3000, 4)), optimizer, step=1)
    state = table.state()
    restored = EmbeddingTable.from_state("items", "uniform", state.ids, state.values, state.slots)
    np.testing.assert_array_equal(restored.rows(ids), table.rows(ids))
    restored.apply(ids[:5], np.ones((5, 4)), optimizer, step=2)
    table.apply(ids[:5], np.ones((5, 4)), optimizer, step=2)
    np.testing.assert_array_equal(restored.rows(ids), table.rows(ids))
    # Re-sharding restores any subset; the missing rows come back as they were created.
    keep = np.arange(0, 3000, 2)
    half = EmbeddingTable.from_state("items", "uniform", state.ids[keep], state.values[keep],
                                     {n: a[keep] for n, a in state.slots.items()})
    np.testing.assert_array_equal(half.rows(ids[keep]), state.values[keep])
    assert half.num_rows == 1500
    never_updated = np.array([123456789])
    np.testing.assert_array_equal(half.rows(never_updated), table.rows(never_updated))


def test_from_state_checks_the_arrays():
    values = np.zeros((3, 2), np.float32)
    with pytest.raises(DataError, match="distinct"):
        EmbeddingTable.from_state("t", "zeros", np.array([1, 2, 1]), values)
    with pytest.raises(DataError, match=r"shape \[2, dim\]"):
        EmbeddingTable.from_state("t", "zeros", np.array([1, 2]), values)
    with pytest.raises(DataError, match="slot 'm'"):
        EmbeddingTable.from_state("t", "zeros", np.array([1, 2, 3]), values, {"m": values[:2]})
    with pytest.raises(DataError, match="input_dim"):
        EmbeddingTable.from_state("t", "zeros", np.array([1, 2, 3]), values, input_dim=3)


def test_growth_keeps_rows_and_slots_and_memory_stays_near_the_raw_bytes():
    table, optimizer = adam_table(dim=16), adam()
    rng = np.random.default_rng(5)
    seen = np.empty(0, dtype=np.int64)
    for step in range(1, 40):
        batch = rng.integers(INT64_MIN, INT64_MAX, 5000, dtype=np.int64)
        table.apply(batch, np.ones((5000, 16), np.float32), optimizer, step)
        seen = np.concatenate([seen, batch])
    assert table.num_rows == len(np.unique(seen))
    state = table.state()
    np.testing.assert_array_equal(state.ids, seen)  # distinct batches keep their order
    # Each row was updated once with a gradient of ones: Adam's first moment is 0.1.
    np.testing.assert_allclose(state.slots["momentum"], 0.1, rtol=1e-6)
    raw = 16 * 4 * 3
    assert table.nbytes / table.num_rows < 1.5 * raw


def test_repeated_and_unique_batches_cost_the_same_memory():
    table = adam_table()
    table.rows(np.zeros(100_000, dtype=np.int64))
    assert table.num_rows == 1
    assert table.capacity == 1024


# -- removal and eviction ----------------------------------------------------------------


def test_a_removed_row_comes_back_as_new_in_a_reused_place():
    table, optimizer = adam_table(), adam()
    ids = np.array([10, 20, 30])
    table.apply(ids, np.ones((3, 4), np.float32), optimizer, step=1)
    fresh = initial_rows("items", np.array([20]), 4, "uniform", 0, np.float32)
    assert table.remove(np.array([20, 99])) == 1 and table.num_rows == 2
    capacity = table.capacity
    np.testing.assert_array_equal(table.rows(np.array([20])), fresh)  # as if never seen
    state = table.state()
    assert state.ids.tolist() == [10, 20, 30] and table.capacity == capacity
    np.testing.assert_array_equal(state.slots["momentum"][1], 0.0)  # its slots start again
    assert np.all(state.slots["momentum"][[0, 2]] > 0)


def test_eviction_drops_idle_rows_then_the_least_recently_updated():
    table, optimizer = adam_table(), adam()
    for step, ids in enumerate(([1, 2, 3, 4], [2, 3], [3], [5]), start=1):
        table.apply(np.array(ids), np.ones((len(ids), 4), np.float32), optimizer, step)
    # Last updated at steps: 1 -> 1, 4 -> 1, 2 -> 2, 3 -> 3, 5 -> 4.
    assert sorted(table.evict(idle_steps=2).tolist()) == [1, 4]
    assert table.evict(max_rows=2).tolist() == [2]  # the least recently updated left
    assert sorted(table.state().ids.tolist()) == [3, 5]
    assert table.evict(max_rows=5, idle_steps=10).tolist() == []


def test_a_stream_of_new_ids_under_a_row_budget_keeps_memory_flat():
    table, optimizer = adam_table(dim=16), adam()
    rng = np.random.default_rng(7)
    sizes, recent = [], []
    for step in range(1, 201):
        batch = rng.integers(INT64_MIN, INT64_MAX, 2000, dtype=np.int64)
        table.apply(batch, np.ones((2000, 16), np.float32), optimizer, step)
        table.evict(max_rows=20_000)
        sizes.append(table.nbytes)
        recent = (recent + [batch])[-10:]
    # The budget keeps the 10 latest batches, exactly.
    assert sorted(table.state().ids.tolist()) == sorted(np.concatenate(recent).tolist())
    assert sizes[-1] == sizes[50]  # from 100k ids seen to 400k, not one byte more


def test_a_push_of_the_ids_a_pull_found_updates_their_rows_even_after_a_removal():
    table, optimizer = adam_table(), adam()
    pulled = np.array([10, 20, 30])
    table.rows(pulled)  # the slots of a pull are remembered for its push
    table.apply(pulled, np.ones((3, 4), np.float32), optimizer, step=1)
    state = table.state()
    assert np.all(state.slots["momentum"] > 0)
    table.rows(pulled)
    table.remove(np.array([20]))
    newcomer = table.rows(np.array([99]))  # takes the place 20 had
    table.apply(pulled, np.ones((3, 4), np.float32), optimizer, step=2)
    np.testing.assert_array_equal(table.rows(np.array([99]), training=False), newcomer)
    state = table.state()
    assert state.ids.tolist() == [10, 99, 30, 20]
    np.testing.assert_array_equal(state.slots["momentum"][1], 0.0)
    assert np.all(state.slots["momentum"][[0, 2, 3]] > 0)
