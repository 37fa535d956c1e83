import threading

import pytest

from elastic_keras.master.coverage import Coverage
from elastic_keras.master.reports import Reports
from elastic_keras.master import epoch_ledger
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.tasks import TaskType


def make(num_epochs=2, retries=2, shards=(("a", 10), ("b", 5)), eval_shards=(), per_task=4):
    return TaskManager(list(shards), per_task, num_epochs, retries, list(eval_shards), seed=0)


def drain(manager, worker=0):
    """Runs every available task to success; returns the tasks."""
    done = []
    while (task := manager.get(worker)) is not None:
        manager.report_result(task.task_id, task.num_records)
        done.append(task)
    return done


def test_tasks_cover_every_record_in_ranges_of_the_task_size():
    manager = make(num_epochs=1)
    tasks = drain(manager)
    ranges = sorted((t.path, t.start, t.end) for t in tasks)
    assert ranges == [("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 4), ("b", 4, 5)]
    assert manager.epoch_finished() == 0


def test_epochs_shuffle_and_end_the_job():
    manager = make(num_epochs=3, shards=[("a", 40)], per_task=2)
    orders = []
    for epoch in range(3):
        tasks = drain(manager)
        assert {t.epoch for t in tasks} == {epoch}
        orders.append([t.start for t in tasks])
        assert manager.epoch_finished() == epoch
        assert not manager.finished
        manager.next_epoch()
    assert manager.finished and not manager.failed
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])
    counts = manager.epoch_counts()
    assert [(c.trained_at_least_once, c.trained_more_than_once) for c in counts] == [(40, 0)] * 3


def test_epoch_is_not_finished_while_a_task_runs():
    manager = make(num_epochs=1, shards=[("a", 8)])
    first, second = manager.get(0), manager.get(1)
    manager.report_result(first.task_id, 4)
    assert manager.get(0) is None
    assert manager.epoch_finished() is None
    manager.report_result(second.task_id, 4)
    assert manager.epoch_finished() == 0


def test_failed_task_resumes_after_reported_progress():
    manager = make(num_epochs=1, shards=[("a", 8)], per_task=8)
    task = manager.get(0)
    manager.report_progress(task.task_id, 3)
    _, outcome = manager.report_result(task.task_id, 3, error="boom")
    assert outcome == "requeued"
    retry = manager.get(1)
    assert (retry.path, retry.start, retry.end, retry.retries) == ("a", 3, 8, 1)
    manager.report_result(retry.task_id, 5)
    [counts] = manager.epoch_counts()
    assert (counts.trained_at_least_once, counts.trained_more_than_once) == (8, 0)
    assert (manager.tasks_done, manager.tasks_failed, manager.tasks_requeued) == (1, 1, 1)


def test_unreported_records_of_a_failed_attempt_are_trained_again():
    manager = make(num_epochs=1, shards=[("a", 8)], per_task=8)
    task = manager.get(0)
    manager.report_progress(task.task_id, 2)
    # The worker trained more than it reported: the retry starts at the last report.
    manager.report_result(task.task_id, 2, error="lost")
    retry = manager.get(0)
    assert retry.start == 2
    manager.report_result(retry.task_id, 6)
    [counts] = manager.epoch_counts()
    assert counts.trained_at_least_once == 8


def test_retry_bound_fails_the_job_with_the_tasks_error():
    manager = make(num_epochs=1, shards=[("a", 4)], retries=2)
    for attempt in range(3):
        task = manager.get(0)
        _, outcome = manager.report_result(task.task_id, 0, error=f"bad record {attempt}")
        assert outcome == ("failed" if attempt == 2 else "requeued")
    assert manager.finished and manager.failed
    assert "failed 3 times" in manager.error and "bad record 2" in manager.error
    assert manager.get(0) is None


def test_lost_worker_tasks_are_requeued_and_stale_reports_ignored():
    manager = make(num_epochs=1, shards=[("a", 8)])
    mine, other = manager.get(7), manager.get(8)
    manager.report_progress(mine.task_id, 1)
    assert manager.recover_worker(7) == 1
    assert manager.report_result(mine.task_id, 4) == (None, "ignored")
    retry = manager.get(8)
    assert (retry.start, retry.end) == (mine.start + 1, mine.end)
    manager.report_result(other.task_id, 4)
    manager.report_result(retry.task_id, 3)
    assert manager.epoch_finished() == 0


def test_evaluation_round_blocks_training_until_done():
    manager = make(num_epochs=2, shards=[("a", 4)], eval_shards=[("v", 6)])
    drain(manager)
    assert manager.epoch_finished() == 0
    assert manager.start_evaluation(model_version=5)
    assert manager.epoch_finished() is None
    evals = []
    while (task := manager.get(0)) is not None:
        assert task.type == TaskType.EVALUATION and task.model_version == 5
        evals.append(task)
    assert [(t.start, t.end) for t in evals] == [(0, 4), (4, 6)]
    assert manager.evaluation_finished() is None
    for task in evals:
        manager.report_result(task.task_id, task.num_records)
    assert manager.evaluation_finished() == (0, 5, True)
    manager.next_epoch()
    assert manager.get(0).type == TaskType.TRAINING


def test_no_validation_data_means_no_round():
    assert not make().start_evaluation(1)


def test_concurrent_workers_get_distinct_tasks():
    manager = make(num_epochs=1, shards=[("a", 4000)], per_task=4)
    seen, lock = [], threading.Lock()

    def work(worker):
        while (task := manager.get(worker)) is not None:
            with lock:
                seen.append((task.start, task.end))
            manager.report_result(task.task_id, task.num_records)

    threads = [threading.Thread(target=work, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 1000 == len(set(seen))
    [counts] = manager.epoch_counts()
    assert counts.trained_at_least_once == 4000 and counts.trained_more_than_once == 0


@pytest.mark.parametrize(
    "ranges, expected",
    [
        ([], (0, 0)),
        ([("f", 1, 0, 10)], (10, 0)),
        ([("f", 1, 0, 10), ("f", 2, 5, 12)], (12, 5)),
        ([("f", 1, 0, 10), ("g", 2, 0, 10)], (20, 0)),
        ([("f", 1, 0, 4), ("f", 1, 0, 8), ("f", 2, 2, 3), ("f", 3, 2, 3)], (8, 1)),
    ],
)
def test_coverage_counts(ranges, expected):
    coverage = Coverage()
    for path, attempt, start, end in ranges:
        coverage.add(path, attempt, start, end)
    assert coverage.counts() == expected


def test_each_epoch_counts_its_training_seconds(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(epoch_ledger.time, "monotonic", lambda: now[0])
    manager = TaskManager([("a", 20)], records_per_task=10, num_epochs=2, max_task_retries=0)
    for start, first_done, last_done in ((10.0, 12.0, 13.25), (20.0, 21.0, 23.0)):
        now[0] = start
        tasks = [manager.get(0), manager.get(1)]
        for task, at in zip(tasks, (first_done, last_done)):
            now[0] = at
            manager.report_result(task.task_id, task.num_records)
        manager.next_epoch()
    assert [c.training_s for c in manager.epoch_counts()] == [3.25, 3.0]


def test_a_result_that_drains_the_queue_wakes_the_masters_loop():
    """`Reports.drained` is set by the result that leaves nothing to hand out, after all
    of it is recorded (the epoch's records and loss), and not by the ones before."""
    reports = Reports(membership=None, evaluations=None)
    reports.tasks = make(num_epochs=1, shards=[("a", 8)])
    first, second = reports.get_task(0), reports.get_task(1)
    reports.report_task_result(0, first.task_id, 4, "", 0.5, 1, ())
    assert not reports.drained.is_set()
    reports.report_task_result(1, second.task_id, 4, "", 0.25, 2, ())
    assert reports.drained.is_set()
    assert reports.throughput.records == 8


def test_a_round_or_a_failure_that_drains_the_queue_wakes_the_masters_loop():
    reports = Reports(membership=None, evaluations=None)
    reports.tasks = make(num_epochs=2, shards=[("a", 4)])
    task = reports.get_task(0)
    reports.report_task_result(0, task.task_id, 2, "boom", 0.0, 1, ())
    assert not reports.drained.is_set()  # its last 2 records are re-queued
    task = reports.get_task(0)
    reports.report_task_result(0, task.task_id, 2, "", 0.5, 1, ())
    assert reports.drained.is_set() and reports.tasks.epoch_finished() == 0
    reports.drained.clear()
    reports.tasks.next_epoch()
    task = reports.get_task(0)
    reports.report_task_result(0, task.task_id, 0, "bad", 0.0, 1, (), fatal="model_module")
    assert reports.drained.is_set() and reports.tasks.failed
