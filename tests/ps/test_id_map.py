import numpy as np
import pytest

from elastic_keras.ps import id_map
from elastic_keras.ps.id_map import MAX_LOAD, RECALLED, SIZED_LOAD, IdMap

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max
ADVERSARIAL = np.array([0, -1, 1, INT64_MIN, INT64_MAX, INT64_MIN + 1, INT64_MAX - 1, -2])


class Reference:
    """The behaviour IdMap must have, as a dict."""

    def __init__(self):
        self.slots, self.free, self.next = {}, set(), 0

    def insert(self, ids):
        for i in ids.tolist():
            if i not in self.slots:
                if self.free:
                    self.slots[i] = min(self.free)
                    self.free.remove(self.slots[i])
                else:
                    self.slots[i], self.next = self.next, self.next + 1
        return self.lookup(ids)

    def remove(self, ids):
        had = self.lookup(ids)
        for i in set(ids.tolist()) & set(self.slots):
            self.free.add(self.slots.pop(i))
        return had

    def lookup(self, ids):
        return [self.slots.get(i, -1) for i in ids.tolist()]


def random_batch(rng, size):
    """Small ids (many repeats), full-range ids and the int64 extremes, shuffled."""
    parts = [
        rng.integers(-40, 40, size // 2),
        rng.integers(INT64_MIN, INT64_MAX, size // 2, dtype=np.int64, endpoint=True),
        rng.choice(ADVERSARIAL, rng.integers(0, 4)),
    ]
    batch = np.concatenate(parts).astype(np.int64)
    rng.shuffle(batch)
    return batch


def test_matches_a_dict_on_random_batches_with_repeats_and_extreme_ids():
    rng = np.random.default_rng(1)
    ids, reference = IdMap(), Reference()
    for round_ in range(300):
        batch = random_batch(rng, int(rng.integers(0, 2000)))
        if round_ % 3:
            assert ids.insert(batch).tolist() == reference.insert(batch), round_
        else:
            assert ids.lookup(batch).tolist() == reference.lookup(batch), round_
        assert len(ids) == len(reference.slots)
    held = sorted(reference.slots.items(), key=lambda item: item[1])
    assert [a.tolist() for a in ids.items()] == [[i for i, _ in held], [s for _, s in held]]
    assert ids.capacity * MAX_LOAD >= len(ids) > 2000


def test_removals_free_slots_that_insertions_reuse_lowest_first():
    rng = np.random.default_rng(2)
    ids, reference = IdMap(), Reference()
    for round_ in range(400):
        batch = random_batch(rng, int(rng.integers(0, 1500)))
        action = ("insert", "remove", "lookup")[round_ % 3]
        assert getattr(ids, action)(batch).tolist() == getattr(reference, action)(batch), round_
        assert len(ids) == len(reference.slots)
    held = sorted(reference.slots.items(), key=lambda item: item[1])
    assert [a.tolist() for a in ids.items()] == [[i for i, _ in held], [s for _, s in held]]
    assert ids.slot_bound == reference.next


def test_recall_answers_the_ids_remembered_and_nothing_else():
    ids = IdMap()
    batch = np.array([7, -3, 12, 40])
    slots = ids.insert(batch)
    ids.remember(batch, slots)
    slots[:] = -5  # the map keeps its own copy
    assert ids.recall(batch).tolist() == [0, 1, 2, 3]
    assert ids.recall(np.array([7, 12, -3, 40])) is None  # same ends, another order
    assert ids.recall(np.array([7, 40])) is None and ids.recall(np.array([], np.int64)) is None
    for first in range(RECALLED):  # older batches make way for newer ones
        more = np.array([100 + first, 200 + first])
        ids.remember(more, ids.insert(more))
    assert ids.recall(batch) is None and ids.recall(np.array([101, 201])).tolist() == [6, 7]


def test_the_batches_remembered_hold_a_bounded_number_of_ids(monkeypatch):
    monkeypatch.setattr(id_map, "RECALLED_IDS", 10)
    ids = IdMap()
    batches = [np.arange(start, start + 4) for start in (0, 10, 20)]
    for batch in batches:
        ids.remember(batch, ids.insert(batch))
    assert ids.recall(batches[0]) is None  # 12 ids: the oldest batch made way
    assert [ids.recall(b).tolist() for b in batches[1:]] == [[4, 5, 6, 7], [8, 9, 10, 11]]
    too_many = np.arange(100, 111)
    ids.remember(too_many, ids.insert(too_many))  # more than all of them: not kept
    assert ids.recall(too_many) is None and ids.recall(batches[2]) is not None


def test_a_recalled_batch_always_answers_what_a_lookup_would():
    rng = np.random.default_rng(3)
    ids, reference, remembered, recalls = IdMap(), Reference(), [], 0
    for round_ in range(300):
        batch = np.unique(random_batch(rng, int(rng.integers(1, 600))))
        action = ("insert", "remove", "insert", "lookup")[round_ % 4]
        answer = getattr(ids, action)(batch)
        assert answer.tolist() == getattr(reference, action)(batch), round_
        if action == "insert":
            ids.remember(batch, answer)
            remembered.append(batch)
        for earlier in remembered[-RECALLED - 2:]:
            recalled = ids.recall(earlier)
            if recalled is not None:  # dropped once an id is removed (its slot is reused)
                assert recalled.tolist() == reference.lookup(earlier), round_
                recalls += 1
    assert recalls > 100 and ids.recall(remembered[-1]) is not None  # inserted last but one


@pytest.mark.parametrize("most", [0, 120_000])
def test_a_map_that_removes_as_much_as_it_adds_keeps_its_size(most):
    ids, rehashes = IdMap(most=most), []
    allocate = ids._allocate
    ids._allocate = lambda capacity: (rehashes.append(capacity), allocate(capacity))
    for start in range(0, 2_000_000, 20_000):
        ids.insert(np.arange(start, start + 20_000))
        if start >= 100_000:
            ids.remove(np.arange(start - 100_000, start - 80_000))
    assert len(ids) == 100_000 and ids.slot_bound == 120_000
    # It grows to twice what it holds (without a bound: 2 x 120k ids at SIZED_LOAD), or to
    # its bound, and is rebuilt at that size when removed entries fill it: at the bound,
    # where 20k of the 100k ids go each round, 49 times over 95 rounds.
    wanted = most or 240_000
    assert max(rehashes) == ids.capacity == int(np.ceil(wanted / SIZED_LOAD))
    assert len(rehashes) <= (50 if most else 10)
    assert ids.slots_after_insert(30_000) == 130_000  # 20k freed slots, then 10k new ones
    assert ids.lookup(np.array([1_999_999, 1_899_999])).tolist()[1] == -1


def test_a_bounded_map_costs_16_bytes_over_sized_load_per_id():
    ids = IdMap(most=200_000)
    for start in range(0, 200_000, 16_384):
        ids.insert(np.arange(start, min(start + 16_384, 200_000)) * 7919)
    assert ids.nbytes / len(ids) == pytest.approx(16 / SIZED_LOAD, rel=1e-3)  # about 24.6


def test_ids_with_one_home_at_the_last_entry():
    """Ids picked to share their first entry, the last one, probe on over the positions past
    it and round to the start: lookups, insertions, removals and reuse match a dict."""
    ids, reference = IdMap(expected=20_000), Reference()
    candidates = np.arange(3_000_000, dtype=np.int64)
    last = ids.capacity - 1  # probes from there pass positions past the last entry
    crowd = candidates[ids._home(candidates.copy()) == last][:100]
    assert len(crowd) == 100
    rng = np.random.default_rng(3)
    for round_ in range(60):
        batch = rng.choice(crowd, int(rng.integers(1, 40)))
        action = ("insert", "insert", "remove", "lookup")[round_ % 4]
        assert getattr(ids, action)(batch).tolist() == getattr(reference, action)(batch), round_
    assert ids.insert(crowd).tolist() == reference.insert(crowd)
    assert ids.lookup(crowd + 3_000_000).tolist() == [-1] * len(crowd)


@pytest.mark.parametrize("removed", [1, 3, 9, 20, 28])
def test_an_insertion_takes_the_first_removed_entry_on_its_way(removed):
    """Ids sharing one first entry line up along one probe sequence, and a lookup reads
    that sequence several positions a round: wherever the removed entry lies in a round's
    positions, the next absent id of the crowd is placed there, not further on."""
    ids = IdMap(expected=20_000)
    candidates = np.arange(3_000_000, dtype=np.int64)
    homes = ids._home(candidates.copy())
    crowd = candidates[homes == homes[0]][:31]
    assert len(crowd) == 31
    for one in crowd[:30]:  # the i-th at the i-th position of the sequence
        ids.insert(one[None])
    keys, _, positions = ids.entries()
    at = dict(zip(keys.tolist(), positions.tolist()))
    ids.remove(crowd[removed:removed + 1])
    assert ids.insert(crowd[30:]).tolist() == [removed]  # the removed id's slot, reused
    new_ids, _, new_positions = ids.entries()
    assert dict(zip(new_ids.tolist(), new_positions.tolist()))[crowd[30]] == at[crowd[removed]]
    assert ids.lookup(crowd).tolist() == [*range(removed), -1, *range(removed + 1, 30), removed]


def test_every_int64_value_is_a_valid_id():
    ids = IdMap()
    assert ids.lookup(ADVERSARIAL).tolist() == [-1] * len(ADVERSARIAL)
    assert ids.insert(ADVERSARIAL).tolist() == list(range(len(ADVERSARIAL)))
    assert ids.lookup(ADVERSARIAL[::-1]).tolist() == list(range(len(ADVERSARIAL)))[::-1]
    assert ids.items()[0].tolist() == ADVERSARIAL.tolist()
    assert ids.remove(ADVERSARIAL[:3]).tolist() == [0, 1, 2]
    assert ids.lookup(ADVERSARIAL).tolist() == [-1, -1, -1, 3, 4, 5, 6, 7]


def test_new_slots_follow_first_appearance_within_a_batch():
    ids = IdMap()
    assert ids.insert(np.array([9, 9, 4, 9, 4, 7])).tolist() == [0, 0, 1, 0, 1, 2]
    assert ids.insert(np.array([5, 4, 5, 3])).tolist() == [3, 1, 3, 4]
    assert ids.items()[0].tolist() == [9, 4, 7, 5, 3]


def test_colliding_ids_in_one_batch_all_land():
    """Thousands of new ids per batch into a nearly full table collide with each other."""
    ids = IdMap(expected=4000)
    capacity = ids.capacity
    batch = np.arange(int(capacity * MAX_LOAD), dtype=np.int64) * 1_000_003
    assert ids.insert(batch).tolist() == list(range(len(batch)))
    assert ids.capacity == capacity  # filled to the maximum load without growing
    assert ids.lookup(batch).tolist() == list(range(len(batch)))
    assert ids.lookup(batch + 1).tolist() == [-1] * len(batch)


def test_growth_keeps_every_slot():
    ids = IdMap()
    batch = np.arange(100_000, dtype=np.int64) * -3
    for start in range(0, len(batch), 7_000):
        ids.insert(batch[start:start + 7_000])
    assert len(ids) <= ids.capacity * MAX_LOAD  # grown to twice what it held, at SIZED_LOAD
    np.testing.assert_array_equal(ids.lookup(batch), np.arange(len(batch)))


def test_shapes_dtypes_and_empty_batches():
    ids = IdMap()
    assert ids.lookup(np.array([], dtype=np.int64)).shape == (0,)
    assert ids.insert(np.array([], dtype=np.int64)).shape == (0,)
    assert ids.insert(np.array([[3, 4], [4, 5]], dtype=np.int32)).tolist() == [[0, 1], [1, 2]]
    assert ids.lookup([5, 6]).tolist() == [2, -1]
    assert ids.lookup(np.array([3], dtype=np.uint8)).dtype == np.int64
    with pytest.raises(TypeError, match="integers"):
        ids.lookup(np.array([1.5]))


def test_bytes_per_entry_stay_bounded():
    ids = IdMap()
    for size in (1000, 50_000, 200_000):
        ids.insert(np.arange(len(ids), size))
        # int64 key + int64 slot = 16 bytes an entry (and one more entry), at a load between
        # SIZED_LOAD / 2 (just grown to twice what it held) and MAX_LOAD.
        assert 16 / MAX_LOAD <= ids.nbytes / len(ids) <= 2 * 16 / SIZED_LOAD + 32 / len(ids)


def test_a_map_held_past_its_bound_grows_by_doubling_not_one_batch_at_a_time():
    ids, rehashes = IdMap(most=100), []
    allocate = ids._allocate
    ids._allocate = lambda capacity: (rehashes.append(capacity), allocate(capacity))
    for start in range(0, 20_000, 100):  # a budget below what the caller inserts
        ids.insert(np.arange(start, start + 100))
    assert len(ids) == 20_000 and len(rehashes) <= 10, rehashes
    np.testing.assert_array_equal(ids.lookup(np.arange(20_000)), np.arange(20_000))
