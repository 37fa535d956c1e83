"""`ps.checkpoint_hold`: which pushes a checkpoint holds back, and when its cut is reached."""

import threading
import time

import pytest

from elastic_keras.common.errors import NotReadyError
from elastic_keras.ps.checkpoint_hold import Hold, PushGate


def test_a_hold_holds_every_push_until_the_cut_lets_its_own_through():
    hold = Hold(checkpoint_id=1, until=time.monotonic() + 60)
    assert hold.holds(0, 4) and hold.holds(0, 3)
    assert hold.held == {0: 4}  # the highest held
    hold.cut = {0: 3}
    assert not hold.holds(0, 3)  # the cut holds it: through
    assert hold.holds(0, 4) and hold.holds(1, 1)


@pytest.mark.parametrize("applied, held, reached", [
    ({0: 3, 1: 2}, {}, True),
    ({0: 2, 1: 2}, {}, False),         # worker 0's sequence 3 not applied yet
    ({0: 2, 1: 2}, {0: 4}, True),      # worker 0 moved past 3: it was dropped here
    ({0: 2, 1: 2}, {0: 3}, False),     # 3 itself is held: it will come
    ({1: 2}, {}, False),               # nothing of worker 0 yet
])
def test_a_cut_is_reached_when_each_worker_applied_or_moved_past_it(applied, held, reached):
    hold = Hold(checkpoint_id=1, until=time.monotonic() + 60, cut={0: 3, 1: 2}, held=held)
    assert hold.reached(applied) is reached


def gate():
    changed = threading.Condition()
    return PushGate(changed), changed


def test_the_gate_answers_held_pushes_and_lets_them_through_once_released():
    pushes, changed = gate()
    with changed:
        assert pushes.held_answer(0, 1, version=3) is None  # no checkpoint: through
        pushes.begin(checkpoint_id=5, hold_s=60)
        answer = pushes.held_answer(0, 1, version=3)
        assert answer.held and not answer.accepted and answer.model_version == 3
        assert answer.reason.startswith("held") and "checkpoint 5" in answer.reason
        pushes.release(4)  # another checkpoint's release changes nothing
        assert pushes.held_answer(0, 1, version=3) is not None
        pushes.release(5)
        assert pushes.held_answer(0, 1, version=3) is None


def test_a_hold_ends_by_itself_when_its_time_is_up():
    pushes, changed = gate()
    with changed:
        pushes.begin(checkpoint_id=1, hold_s=0.05)
        assert pushes.held_answer(0, 1, version=0) is not None
    time.sleep(0.1)
    with changed:
        assert pushes.held_answer(0, 1, version=0) is None
        with pytest.raises(NotReadyError, match="holds no pushes"):
            pushes.wait_for_cut(1, {}, {})


def test_waiting_for_the_cut_lets_its_pushes_through_and_wakes_when_they_are_applied():
    pushes, changed = gate()
    applied = {0: 1}
    with changed:
        pushes.begin(checkpoint_id=2, hold_s=10)
    done = []

    def take():
        with changed:
            pushes.wait_for_cut(2, {0: 2}, applied)
            done.append(True)

    taking = threading.Thread(target=take)
    taking.start()
    time.sleep(0.1)
    with changed:
        assert not done
        assert pushes.held_answer(0, 2, version=1) is None  # in the cut
        applied[0] = 2  # the shard applies it and notifies
        changed.notify_all()
    taking.join(timeout=5)
    assert done
    with changed:
        assert pushes.held_answer(0, 3, version=2) is None  # the hold ended


def test_a_cut_not_reached_in_time_abandons_the_checkpoint_and_names_what_is_missing():
    pushes, changed = gate()
    with changed:
        pushes.begin(checkpoint_id=3, hold_s=0.2)
        with pytest.raises(NotReadyError, match=r"missing sequences \{1: 4\}"):
            pushes.wait_for_cut(3, {0: 1, 1: 4}, {0: 1, 1: 2})
        assert pushes.held_answer(1, 5, version=0) is None
        with pytest.raises(NotReadyError, match="Received: checkpoint_id=3"):
            pushes.wait_for_cut(3, {}, {})


def test_a_new_checkpoint_replaces_the_hold_of_an_earlier_one():
    pushes, changed = gate()
    with changed:
        pushes.begin(checkpoint_id=1, hold_s=60)
        pushes.begin(checkpoint_id=2, hold_s=60)
        with pytest.raises(NotReadyError, match="another checkpoint began"):
            pushes.wait_for_cut(1, {}, {})
        pushes.wait_for_cut(2, {}, {})
