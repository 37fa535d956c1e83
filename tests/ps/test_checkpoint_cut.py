"""A shard's side of consistent checkpoints: holds, cuts, open rounds, incarnations and
versions that never go backwards."""

import json
import threading
import time

import keras
import numpy as np
import pytest

from elastic_keras.common.errors import NotReadyError, PayloadError
from elastic_keras.ps.consistency import UpdatePolicy
from elastic_keras.ps.parameters import Parameters
from elastic_keras.ps.shard_types import Push, VariableOptions

SGD = json.dumps(keras.optimizers.serialize(keras.optimizers.SGD(0.5)))


def shard(min_version=0, **policy):
    params = Parameters(UpdatePolicy(**policy), min_version)
    params.init_model([("w", np.zeros(2, np.float32))], SGD)
    return params


def push(params, worker, seq, version=None, incarnation=0):
    version = params.version if version is None else version
    return params.push(Push(worker, seq, version, (("w", np.ones(2, np.float32)),),
                            incarnation=incarnation))


def test_pushes_wait_while_a_checkpoint_is_taken_and_the_cut_is_complete():
    params = shard()
    assert push(params, 0, 1).accepted and push(params, 1, 1).accepted
    applied, version = params.prepare_checkpoint(7, hold_s=10)
    assert (applied, version) == ({0: 1, 1: 1}, 2)
    held = push(params, 0, 2)
    assert held.held and not held.accepted and params.version == 2
    # The cut holds worker 0's second minibatch (another shard applied it): the snapshot
    # waits for it, and only it gets through.
    snapshots = []
    taking = threading.Thread(target=lambda: snapshots.append(
        params.snapshot_at_cut(7, {0: 2, 1: 1})))
    taking.start()
    time.sleep(0.2)
    assert not snapshots
    assert push(params, 1, 2).held  # not in the cut
    assert push(params, 0, 2).accepted
    taking.join(timeout=10)
    (snapshot,) = snapshots
    assert snapshot.version == 3 and snapshot.applied_sequences == {0: 2, 1: 1}
    assert snapshot.applied_pushes == {0: 2, 1: 1}
    assert push(params, 1, 2).accepted and params.version == 4  # let through again


def test_a_cut_not_reached_while_the_hold_lasts_abandons_the_checkpoint():
    params = shard()
    params.prepare_checkpoint(1, hold_s=0.3)
    with pytest.raises(NotReadyError, match=r"missing sequences \{0: 5\}"):
        params.snapshot_at_cut(1, {0: 5})
    assert push(params, 0, 1).accepted  # nothing held any more
    with pytest.raises(NotReadyError, match="holds no pushes"):
        params.snapshot_at_cut(2, {})


def test_a_snapshot_applies_the_open_synchronous_round_it_records():
    params = shard(grads_to_wait=2)
    assert push(params, 0, 1).accepted and params.pending_pushes == 1
    snapshot = params.snapshot()
    # The round's one push is in the values and the sequences alike (a restored shard
    # would otherwise take the push's retry for a duplicate and lose its gradient).
    assert snapshot.version == 1 and snapshot.applied_sequences == {0: 1}
    np.testing.assert_allclose(snapshot.dense["w"], [-0.5, -0.5])
    assert params.pending_pushes == 0 and params.applied_pushes == {0: 1}


def test_a_restarted_shard_refuses_what_was_computed_against_its_earlier_run():
    before = shard(grads_to_wait=0)
    push(before, 0, 1)
    after = Parameters(UpdatePolicy(), min_version=5)
    after.restore(before.snapshot())
    assert after.version == 5  # never back to the checkpoint's 1
    assert after.incarnation != before.incarnation
    # Values pulled from the earlier run at the same version number are sent again.
    assert after.pull(known_version=5, known_incarnation=before.incarnation).dense
    assert not after.pull(known_version=5, known_incarnation=after.incarnation).dense
    stale = push(after, 0, 2, version=5, incarnation=before.incarnation)
    assert stale.stale and "earlier run" in stale.reason
    # A version above this run's, from this run, no pull gave: malformed, not stale.
    with pytest.raises(PayloadError, match="model_version must be one this shard gave.*"
                       "Received: model_version=9"):
        push(after, 0, 2, version=9, incarnation=after.incarnation)
    # From a run it does not name, it may come from an earlier run that went further.
    future = push(after, 0, 2, version=9, incarnation=0)
    assert future.stale and "has not reached" in future.reason
    assert push(after, 0, 2, version=5, incarnation=after.incarnation).accepted
    # The tables' sparse optimizer counts updates, not versions: the jump does not skip
    # its bias-correction steps.
    assert after.snapshot().table_steps == 2 and after.version == 6


def test_a_new_model_starts_at_the_minimum_version():
    params = shard(min_version=12)
    assert params.version == 12 and params.pull().model_version == 12


def test_a_snapshot_without_variable_options_takes_them_from_the_workers_init():
    """Files written before variables had options made every float variable trainable: the
    first InitModel with options marks the statistics non-trainable, so their deltas apply."""
    values = [("w", np.zeros(2, np.float32)), ("bn/moving_mean", np.zeros(2, np.float32))]
    adam = json.dumps(keras.optimizers.serialize(keras.optimizers.Adam(0.1)))
    old = Parameters()
    old.init_model(values, adam)
    old_file = old.snapshot()
    old_file = type(old_file)(**{**old_file.__dict__, "variable_options": {}})
    restored = Parameters()
    restored.restore(old_file)
    delta = Push(0, 1, 0, (("w", np.ones(2, np.float32)),),
                 deltas=(("bn/moving_mean", np.ones(2, np.float32)),))
    with pytest.raises(Exception, match="non-trainable"):
        restored.push(delta)
    options = [VariableOptions("w"), VariableOptions("bn/moving_mean", trainable=False)]
    assert not restored.init_model(values, adam, (), options).initialized_now
    assert restored.push(delta).accepted
    np.testing.assert_allclose(restored.pull().dense["bn/moving_mean"], [1.0, 1.0])


def test_a_worker_that_moved_past_the_cut_does_not_stall_the_checkpoint():
    """The cut asks for worker 0's sequence 6, which this shard never got (dropped here);
    the worker's next push, 7, shows it moved on: the snapshot need not wait for 6."""
    params = shard()
    assert push(params, 0, 5).accepted
    params.prepare_checkpoint(3, hold_s=10)
    snapshots = []
    taking = threading.Thread(target=lambda: snapshots.append(
        params.snapshot_at_cut(3, {0: 6})))
    taking.start()
    assert push(params, 0, 7).held
    taking.join(timeout=5)
    assert snapshots and snapshots[0].applied_sequences == {0: 5}
    assert push(params, 0, 7).accepted


def test_a_released_checkpoint_lets_pushes_through():
    params = shard()
    params.prepare_checkpoint(4, hold_s=60)
    assert push(params, 0, 1).held
    params.release_checkpoint(3)  # another checkpoint's release changes nothing
    assert params.held(0, 1) is not None
    params.release_checkpoint(4)
    assert params.held(0, 1) is None and push(params, 0, 1).accepted
