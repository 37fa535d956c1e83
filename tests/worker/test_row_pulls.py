"""`RowPulls`: tables looked up with equal ids are pulled together from the next step on,
and rows are only ever served for the ids and the step they were pulled for."""

import numpy as np
import pytest

from elastic_keras.worker.row_pulls import RowPulls


class Shards:
    """A pull function that records each call's tables and serves rows derived from the
    table and the ids (row of id i in table t: [i + offset(t)])."""

    OFFSETS = {"linear": 0.5, "factors": 1000.0, "other": -7.0}

    def __init__(self):
        self.calls = []

    def __call__(self, ids_by_table):
        self.calls.append(sorted(ids_by_table))
        return {t: (ids + self.OFFSETS[t]).astype(np.float32)[:, None]
                for t, ids in ids_by_table.items()}


def _rows_of(table, ids):
    return (ids + Shards.OFFSETS[table]).astype(np.float32)[:, None]


@pytest.fixture
def shards():
    return Shards()


def test_tables_seen_with_equal_ids_are_pulled_in_one_call_from_the_next_step(shards):
    pulls = RowPulls(shards)
    ids = np.array([5, 2, 9])
    for step in range(3):
        np.testing.assert_array_equal(pulls.rows("linear", ids), _rows_of("linear", ids))
        np.testing.assert_array_equal(pulls.rows("factors", ids.copy()),
                                      _rows_of("factors", ids))
        pulls.end_step()
    # The first step learns; the two after pull both tables at once.
    assert shards.calls == [["linear"], ["factors"], ["factors", "linear"],
                            ["factors", "linear"]]


def test_a_partner_with_other_ids_this_step_is_pulled_on_its_own(shards):
    pulls = RowPulls(shards)
    ids, other = np.array([1, 2, 3]), np.array([1, 2, 4])
    pulls.rows("linear", ids)
    pulls.rows("factors", ids)
    pulls.end_step()
    pulls.rows("linear", ids)
    rows = pulls.rows("factors", other)  # the prefetched rows are for [1, 2, 3]: not used
    np.testing.assert_array_equal(rows, _rows_of("factors", other))
    assert shards.calls[-1] == ["factors"]
    pulls.end_step()
    # They no longer share ids: each is pulled alone again.
    pulls.rows("linear", ids)
    pulls.rows("factors", other)
    assert shards.calls[-2:] == [["linear"], ["factors"]]


def test_rows_pulled_for_a_partner_never_outlive_their_step(shards):
    pulls = RowPulls(shards)
    ids = np.array([7, 8])
    pulls.rows("linear", ids)
    pulls.rows("factors", ids)
    pulls.end_step()
    pulls.rows("linear", ids)  # pulls "factors" too; the step then fails before using them
    pulls.end_step()
    calls = len(shards.calls)
    rows = pulls.rows("factors", ids)
    assert len(shards.calls) == calls + 1  # pulled afresh, not taken from the dead step
    np.testing.assert_array_equal(rows, _rows_of("factors", ids))


def test_each_lookup_of_a_table_keeps_its_own_partners(shards):
    pulls = RowPulls(shards)
    a, b = np.array([1, 2]), np.array([3])
    for _ in range(2):
        pulls.rows("linear", a)
        pulls.rows("factors", a)
        pulls.rows("other", b)
        pulls.rows("linear", b)  # the second lookup of "linear" shares ids with "other"
        pulls.end_step()
    assert shards.calls[4:] == [["factors", "linear"], ["linear", "other"]]
    pulls.rows("linear", a)
    np.testing.assert_array_equal(pulls.rows("factors", a), _rows_of("factors", a))
    np.testing.assert_array_equal(pulls.rows("other", b), _rows_of("other", b))
    np.testing.assert_array_equal(pulls.rows("linear", b), _rows_of("linear", b))
    assert len(shards.calls) == 8  # each pair in one call


def test_a_failed_pull_leaves_nothing_behind(shards):
    def failing(ids_by_table):
        raise RuntimeError("shard down")

    pulls = RowPulls(failing)
    with pytest.raises(RuntimeError, match="shard down"):
        pulls.rows("linear", np.array([1]))
    pulls.end_step()
    pulls._pull = shards
    np.testing.assert_array_equal(pulls.rows("linear", np.array([1])),
                                  _rows_of("linear", np.array([1])))
