"""The task manager's recovery, timeouts, mid-epoch evaluation rounds and persistence."""

import json

import pytest

from elastic_keras.master import running_tasks
from elastic_keras.master.coverage import Coverage
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.tasks import EvalRound, TaskType


def make(num_epochs=1, retries=2, shards=(("a", 8),), eval_shards=(), per_task=4):
    return TaskManager(list(shards), per_task, num_epochs, retries, list(eval_shards), seed=0)


def drain(manager, worker=0):
    """Runs every available task to success; returns the tasks."""
    done = []
    while (task := manager.get(worker)) is not None:
        manager.report_result(task.task_id, task.num_records)
        done.append(task)
    return done


def counts(manager):
    return [(c.trained_at_least_once, c.trained_more_than_once) for c in manager.epoch_counts()]


class Clock:
    """Stands in for the `time` module in the task manager: `monotonic()` is `now`."""

    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(running_tasks, "time", clock)
    return clock


# -- losing a worker, handing back ---------------------------------------------------------


def test_losing_a_worker_counts_no_retry():
    manager = make(retries=0, shards=[("a", 4)])
    for lost_worker in (1, 2, 3):  # more losses than retries allowed: the job goes on
        task = manager.get(lost_worker)
        assert task.retries == 0
        assert manager.recover_worker(lost_worker) == 1
    assert not manager.failed
    assert (manager.tasks_failed, manager.tasks_requeued) == (0, 3)
    task = manager.get(4)
    assert manager.report_result(task.task_id, 0, error="bad record")[1] == "failed"


def test_abandoned_task_is_handed_back_from_its_progress_without_failing():
    manager = make(retries=0, shards=[("a", 8)], per_task=8)
    task = manager.get(0)
    manager.report_progress(task.task_id, 2)
    returned, outcome = manager.report_result(task.task_id, 5, error="preempted",
                                              abandoned=True)
    assert (returned, outcome) == (task, "requeued")
    assert (manager.tasks_handed_back, manager.tasks_requeued) == (1, 1)
    assert (manager.tasks_failed, manager.failed) == (0, False)
    again = manager.get(1)
    assert (again.start, again.end, again.retries, again.origin) == (5, 8, 0, ("a", 0, 8))
    assert manager.progress() == (0, 5, 8)
    manager.report_result(again.task_id, 3)
    assert counts(manager) == [(8, 0)]
    assert manager.tasks_done == 1 and manager.epoch_finished() == 0


def test_tasks_lost_with_their_worker_are_counted_per_epoch_and_kept_in_the_state(clock):
    manager = make(num_epochs=2, retries=1, shards=[("a", 12)], per_task=4)
    died = manager.get(1)  # its worker dies: lost
    manager.report_progress(died.task_id, 2)
    assert manager.recover_worker(1) == 1
    late = manager.get(2)  # held too long: lost
    [(task_id, *_)] = manager.overdue(floor_s=1.0, now=5.0)
    manager.requeue_overdue(task_id)
    failed = manager.get(3)  # failed, and left: both report what landed, so not lost
    manager.report_result(failed.task_id, 1, error="boom")
    left = manager.get(4)
    manager.report_result(left.task_id, 1, error="preempted", abandoned=True)
    assert late.task_id == task_id
    assert [c.tasks_lost for c in manager.epoch_counts()] == [2, 0]
    drain(manager)
    manager.next_epoch()
    manager.get(5)
    manager.recover_worker(5)
    assert [c.tasks_lost for c in manager.epoch_counts()] == [2, 1]
    restored = restore(manager.state(), shards=[("a", 12)], max_task_retries=1)
    # The running task re-queued by the restore is not counted: no worker lost it.
    assert [c.tasks_lost for c in restored.epoch_counts()] == [2, 1]


def test_abandoned_evaluation_task_starts_over():
    manager = make(shards=[("a", 4)], eval_shards=[("v", 4)])
    drain(manager)
    manager.start_evaluation(1)
    task = manager.get(0)
    manager.report_result(task.task_id, 3, abandoned=True)
    again = manager.get(1)
    assert (again.type, again.start, again.end, again.model_version) == (
        TaskType.EVALUATION, 0, 4, 1)


# -- timeouts ------------------------------------------------------------------------------


def test_overdue_uses_the_floor_until_a_task_of_the_type_completed(clock):
    manager = make(shards=[("a", 12)])
    first, second, third = manager.get(1), manager.get(2), manager.get(3)
    clock.now = 10.0
    assert manager.overdue(floor_s=10.0) == []
    assert manager.overdue(floor_s=10.0, now=10.5) == [
        (first.task_id, 1, 10.5), (second.task_id, 2, 10.5), (third.task_id, 3, 10.5)]
    assert manager.overdue(floor_s=0, now=1e9) == []  # disabled

    clock.now = 6.0
    manager.report_result(first.task_id, 4)  # took 6 s: the limit is max(10, 3 * 6) = 18 s
    assert manager.overdue(floor_s=10.0, now=18.0) == []
    assert manager.overdue(floor_s=10.0, now=18.5) == [
        (second.task_id, 2, 18.5), (third.task_id, 3, 18.5)]
    assert manager.overdue(floor_s=20.0, now=18.5) == []  # the floor wins
    assert [o.task_id for o in manager.overdue(floor_s=10.0, factor=2.0, now=12.5)] == [
        second.task_id, third.task_id]


def test_evaluation_tasks_time_out_on_their_own_durations(clock):
    manager = make(shards=[("a", 4)], eval_shards=[("v", 8)])
    task = manager.get(0)
    clock.now = 100.0
    manager.report_result(task.task_id, 4)  # a slow training task: 100 s
    manager.start_evaluation(1)
    clock.now = 101.0
    evaluation = manager.get(0)
    assert manager.overdue(floor_s=5.0, now=106.5) == [(evaluation.task_id, 0, 5.5)]
    clock.now = 121.0
    manager.report_result(evaluation.task_id, 4)  # 20 s: the next one may take 60 s
    second = manager.get(0)
    assert manager.overdue(floor_s=5.0, now=181.0) == []
    assert manager.overdue(floor_s=5.0, now=181.5) == [(second.task_id, 0, 60.5)]


def test_overdue_task_is_requeued_from_its_progress_and_its_late_result_ignored(clock):
    manager = make(retries=0, shards=[("a", 8)], per_task=8)
    task = manager.get(7)
    manager.report_progress(task.task_id, 3)
    [(task_id, worker, held_s)] = manager.overdue(floor_s=1.0, now=2.0)
    assert held_s == 2.0
    assert manager.requeue_overdue(task_id) == worker == 7
    assert manager.requeue_overdue(task_id) is None
    assert (manager.tasks_timed_out, manager.tasks_requeued, manager.tasks_failed) == (1, 1, 0)
    assert manager.report_result(task_id, 8) == (None, "ignored")
    manager.report_progress(task_id, 8)  # ignored too
    again = manager.get(8)
    assert (again.start, again.end, again.retries) == (3, 8, 0)
    manager.report_result(again.task_id, 5)
    assert counts(manager) == [(8, 0)] and manager.epoch_finished() == 0


# -- evaluation rounds mid-epoch -----------------------------------------------------------


def test_mid_epoch_round_waits_for_running_training_and_holds_back_the_rest():
    manager = make(shards=[("a", 16)], eval_shards=[("v", 6)])
    first, second = manager.get(0), manager.get(1)
    assert manager.start_evaluation(7, end_of_epoch=False)
    assert not manager.start_evaluation(8, end_of_epoch=False)  # one round at a time
    assert manager.get(2) is None  # no training handed out, no evaluation yet
    assert manager.training_load() == (0, 2) and manager.depth()[0] == 2 + 2  # 2 of each
    manager.report_result(first.task_id, 4)
    assert manager.get(2) is None  # `second` still trains
    assert manager.evaluation_finished() is None and manager.epoch_finished() is None
    manager.report_result(second.task_id, 4)

    evaluations = [manager.get(2), manager.get(3)]
    assert [(t.type, t.model_version) for t in evaluations] == [(TaskType.EVALUATION, 7)] * 2
    assert manager.get(4) is None
    manager.report_result(evaluations[0].task_id, 4)
    assert manager.evaluation_finished() is None
    manager.report_result(evaluations[1].task_id, 2)
    assert manager.evaluation_finished() == EvalRound(0, 7, False)
    assert manager.evaluation_finished() is None

    assert manager.training_load() == (2, 0)
    rest = drain(manager)
    assert [t.type for t in rest] == [TaskType.TRAINING] * 2
    assert manager.epoch_finished() == 0
    assert counts(manager) == [(16, 0)]


def test_training_that_fails_during_a_round_waits_for_the_round_to_end():
    manager = make(shards=[("a", 8)], eval_shards=[("v", 4)])
    task = manager.get(0)
    manager.start_evaluation(3, end_of_epoch=False)
    manager.report_result(task.task_id, 1, error="boom")
    [evaluation] = drain(manager)
    assert evaluation.type == TaskType.EVALUATION
    assert manager.evaluation_finished() == EvalRound(0, 3, False)
    assert [(t.start, t.retries) for t in drain(manager)][0] == (task.start + 1, 1)
    assert manager.epoch_finished() == 0


def test_a_mid_epoch_round_open_when_the_epoch_ends_closes_the_epoch():
    manager = make(num_epochs=2, shards=[("a", 8)], eval_shards=[("v", 4)])
    first, second = manager.get(0), manager.get(1)
    assert manager.start_evaluation(3, end_of_epoch=False)
    manager.report_result(first.task_id, 4)
    manager.report_result(second.task_id, 4)
    assert manager.epoch_finished() is None  # the open round will close the epoch
    drain(manager)
    assert manager.evaluation_finished() == EvalRound(0, 3, True)
    # No second round for the same epoch before next_epoch().
    assert manager.epoch_finished() is None
    assert not manager.start_evaluation(4, end_of_epoch=False)
    manager.next_epoch()
    assert manager.get(0).epoch == 1


def test_end_of_epoch_round_needs_the_epochs_training_done():
    manager = make(shards=[("a", 8)], eval_shards=[("v", 4)])
    manager.get(0)
    with pytest.raises(ValueError, match="end_of_epoch=True"):
        manager.start_evaluation(1)
    assert manager.start_evaluation(1, end_of_epoch=False)


def test_no_round_without_validation_data_or_after_the_job():
    assert not make().start_evaluation(1, end_of_epoch=False)
    manager = make(shards=[("a", 4)], eval_shards=[("v", 4)])
    drain(manager)
    manager.next_epoch()
    assert manager.finished and not manager.start_evaluation(1, end_of_epoch=False)


# -- persistence ---------------------------------------------------------------------------


SHARDS = [("a", 12), ("b", 6)]  # tasks a[0,4) a[4,8) a[8,12) b[0,4) b[4,6): 18 records


def restore(state, **changes):
    args = dict(shards=SHARDS, records_per_task=4, num_epochs=2, max_task_retries=2)
    args.update(changes)
    return TaskManager.from_state(json.loads(json.dumps(state)), **args)


def test_state_round_trip_mid_epoch_with_running_and_partly_reported_tasks():
    manager = make(num_epochs=2, shards=SHARDS)
    drain(manager)
    manager.next_epoch()
    done = manager.get(0)
    manager.report_result(done.task_id, done.num_records)
    reported = manager.get(1)  # trains it all, but reports only 3 records before the crash
    manager.report_progress(reported.task_id, 3)
    failing = manager.get(2)
    manager.report_progress(failing.task_id, 1)
    manager.report_result(failing.task_id, 1, error="boom")
    retry = manager.get(3)  # the retry of `failing`, from its record 1
    manager.report_progress(retry.task_id, 1)
    silent = manager.get(4)  # reports nothing
    waiting = manager.training_load()[0]
    assert (retry.start, retry.retries, waiting) == (failing.start + 1, 1, 1)

    state = manager.state()
    assert state["format"] == 1
    restored = restore(state)

    assert restored.epoch == 1 and restored.epoch_finished() is None
    assert counts(restored) == counts(manager) == [
        (18, 0), (done.num_records + 3 + 1 + 1, 0)]
    assert restored.progress() == manager.progress() == (1, done.num_records + 5, 18)
    assert (restored.tasks_done, restored.tasks_failed) == (6, 1)
    assert restored.tasks_requeued == 1 + 3  # the error, then the 3 running tasks
    assert restored.training_load() == (4, 0)
    # Old ids are never reused: a worker's late result for them is ignored.
    assert restored.report_result(reported.task_id, reported.num_records) == (None, "ignored")

    rest = drain(restored, worker=9)
    resumed = {(t.path, t.start, t.end, t.retries) for t in rest}
    assert {(reported.path, reported.start + 3, reported.end, 0),
            (retry.path, retry.start + 1, retry.end, 1),
            (silent.path, silent.start, silent.end, 0)} <= resumed
    assert len(rest) == 4 and min(t.task_id for t in rest) > state["last_task_id"]
    # The records trained past the last report count as not trained, and are trained once
    # more: every record exactly once in the master's books.
    assert counts(restored) == [(18, 0), (18, 0)]
    assert restored.epoch_finished() == 1
    restored.next_epoch()
    assert restored.finished and not restored.failed
    # Neither epoch was all trained by the restored manager: neither is timed.
    assert [c.training_s for c in restored.epoch_counts()] == [None, None]


def test_coverage_state_keeps_trained_once_and_more_than_once_exact():
    coverage = Coverage()
    for attempt, (path, start, end) in enumerate(
            [("f", 0, 10), ("f", 5, 12), ("f", 6, 8), ("g", 0, 3), ("g", 3, 4)]):
        coverage.add(path, attempt, start, end)
    state = json.loads(json.dumps(coverage.state()))
    assert state == {"f": [[0, 5, 1], [5, 10, 2], [10, 12, 1]], "g": [[0, 4, 1]]}
    restored = Coverage.from_state(state)
    assert restored.counts() == coverage.counts() == (16, 5)
    for both in (coverage, restored):
        both.add("f", 20, 11, 14)  # new attempts: f[11, 12) and g[0, 1) twice now
        both.add("g", 21, 0, 1)
    assert restored.counts() == coverage.counts() == (18, 7)


def test_restored_epoch_whose_training_was_complete_reruns_its_round():
    manager = make(num_epochs=2, shards=SHARDS, eval_shards=[("v", 8)])
    drain(manager)
    assert manager.start_evaluation(5)
    manager.get(0)  # one evaluation task running when the master stops
    restored = restore(manager.state(), eval_shards=[("v", 8)])
    assert restored.epoch_finished() == 0
    assert restored.start_evaluation(5)
    evaluations = drain(restored)
    assert [(t.start, t.end) for t in evaluations] == [(0, 4), (4, 8)]
    assert restored.evaluation_finished() == EvalRound(0, 5, True)


def test_finished_and_failed_jobs_restore_as_such():
    manager = make(num_epochs=2, shards=SHARDS)
    for _ in range(2):
        drain(manager)
        manager.next_epoch()
    restored = restore(manager.state())
    assert restored.finished and not restored.failed
    assert restored.get(0) is None and restored.epoch_finished() is None
    assert counts(restored) == [(18, 0), (18, 0)] and restored.tasks_done == 10

    failing = make(num_epochs=2, shards=SHARDS, retries=0)
    task = failing.get(0)
    failing.report_result(task.task_id, 0, error="bad record")
    restored = restore(failing.state())
    assert restored.finished and restored.failed and "bad record" in restored.error


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(shards=[("a", 12)]), r"'b' \(6 records\) is missing"),
        (dict(shards=SHARDS + [("c", 3)]), r"Received: 'c', not in the state"),
        (dict(shards=[("a", 12), ("b", 7)]), r"'b' had 6 records\. Received: 7 records"),
        (dict(records_per_task=5), r"records_per_task must match the state's 4; "
                                   r"Received: records_per_task=5"),
        (dict(num_epochs=3), r"num_epochs must match the state's 2; Received: num_epochs=3"),
    ],
)
def test_state_made_with_other_data_or_settings_is_rejected(changes, message):
    state = make(num_epochs=2, shards=SHARDS).state()
    with pytest.raises(ValueError, match=message):
        restore(state, **changes)


def test_unknown_or_broken_state_is_rejected():
    state = make(num_epochs=2, shards=SHARDS).state()
    with pytest.raises(ValueError, match="format must be 1; Received: format=2"):
        restore(dict(state, format=2))
    broken = dict(state)
    del broken["coverage"]
    with pytest.raises(ValueError, match="not a valid task manager state"):
        restore(broken)
