"""The prediction round in the task queue, and the `PredictionSink` that takes its outputs:
every record once, whatever happened to the attempts before."""

import json
import threading

import numpy as np
import pytest

from elastic_keras.common.errors import ConfigError, PayloadError
from elastic_keras.common.transfer.tensor_codec import encode
from elastic_keras.master.predictions import PredictionSink
from elastic_keras.master.task_manager import TaskManager
from elastic_keras.master.tasks import Task, TaskType


def _prediction_queue(shards=(("a", 10), ("b", 5))):
    return TaskManager([], 4, 1, 2, list(shards), seed=0, eval_type=TaskType.PREDICTION)


def _open_round(manager):
    assert manager.epoch_finished() == 0  # no training at all
    assert manager.start_evaluation(7)


def test_a_prediction_job_is_one_round_of_prediction_tasks_over_every_record():
    manager = _prediction_queue()
    _open_round(manager)
    tasks = []
    while (task := manager.get(0)) is not None:
        manager.report_result(task.task_id, task.num_records)
        tasks.append(task)
    assert {t.type for t in tasks} == {TaskType.PREDICTION}
    assert {t.model_version for t in tasks} == {7}
    assert sorted((t.path, t.start, t.end) for t in tasks) == [
        ("a", 0, 4), ("a", 4, 8), ("a", 8, 10), ("b", 0, 4), ("b", 4, 5)]
    finished = manager.evaluation_finished()
    assert finished is not None and finished.end_of_epoch
    manager.next_epoch()
    assert manager.finished and manager.round_records == 15


@pytest.mark.parametrize("how", ["lost", "handed_back", "failed"])
def test_a_prediction_task_taken_over_starts_again_from_its_first_record(how):
    manager = _prediction_queue([("a", 8)])
    _open_round(manager)
    task = manager.get(0)
    manager.report_progress(task.task_id, 3)  # counts for nothing: outputs come at the end
    if how == "lost":
        manager.recover_worker(0)
    else:
        manager.report_result(task.task_id, 3, error="x" if how == "failed" else "",
                              abandoned=how == "handed_back")
    again = manager.get(1)
    assert (again.start, again.end, again.type) == (task.start, task.end, TaskType.PREDICTION)
    # The first attempt's late result is not taken: it is no longer running.
    assert manager.report_result(task.task_id, 4)[0] is None


def _task(path="/data/f1.rec", start=4, end=7):
    return Task(9, TaskType.PREDICTION, path, start, end, 0)


def test_without_a_processor_each_task_is_one_file_of_its_records_in_order(tmp_path):
    sink = PredictionSink(["/data/f0.rec", "/data/f1.rec"], 2, output=str(tmp_path))
    task = _task()
    outputs = sink.decode(task, [encode("", np.arange(6, dtype=np.float32).reshape(3, 2))])
    sink.add(task, 1, outputs)
    assert sink.close() == ""
    files = list((tmp_path / "predictions").iterdir())
    assert [f.name for f in files] == ["part-00001-0000000004.jsonl"]
    lines = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert lines == [{"file": "/data/f1.rec", "record": 4 + i, "prediction": [2.0 * i, 2.0 * i + 1]}
                     for i in range(3)]
    assert sink.records == 3 and not sink.error


def test_a_model_with_named_outputs_writes_them_by_name(tmp_path):
    sink = PredictionSink(["/data/f1.rec"], 2, output=str(tmp_path))
    task = _task(start=0, end=2)
    outputs = sink.decode(task, [encode("score", np.array([0.5, 0.25], np.float32)),
                                 encode("label", np.array([[1], [0]], np.int64))])
    sink.add(task, 0, outputs)
    sink.close()
    first = json.loads((tmp_path / "predictions" / "part-00000-0000000000.jsonl")
                       .read_text().splitlines()[0])
    assert first["prediction"] == {"score": 0.5, "label": [1]}


def test_the_part_files_an_earlier_job_left_are_removed_and_nothing_else(tmp_path):
    directory = tmp_path / "predictions"
    directory.mkdir()
    (directory / "part-00007-0000000000.jsonl").write_text("an earlier job's\n")
    (directory / "notes.txt").write_text("the user's")
    sink = PredictionSink(["/data/f1.rec"], 2, output=str(tmp_path))
    assert sink.close() == ""
    assert [f.name for f in directory.iterdir()] == ["notes.txt"]


def test_an_output_directory_that_cannot_hold_predictions_is_named(tmp_path):
    (tmp_path / "predictions").write_text("a file, not a directory")
    with pytest.raises(ConfigError, match="predictions go to .*predictions, which must be a "
                                          "directory this job can write"):
        PredictionSink(["/data/f1.rec"], 2, output=str(tmp_path))


class _Recorder:
    def __init__(self, fail_at=None):
        self.calls, self.fail_at = [], fail_at

    def process(self, predictions, worker_id):
        if len(self.calls) == self.fail_at:
            raise RuntimeError("disk full")
        self.calls.append((np.array(predictions), worker_id))


def test_a_processor_gets_every_minibatch_of_a_task_in_record_order():
    processor = _Recorder()
    sink = PredictionSink(["/data/f1.rec"], 2, processor=processor)
    task = _task(start=0, end=5)
    sink.add(task, 3, sink.decode(task, [encode("", np.arange(5, dtype=np.int64))]))
    sink.close()
    assert [(c.tolist(), w) for c, w in processor.calls] == [([0, 1], 3), ([2, 3], 3), ([4], 3)]
    assert sink.where == "_Recorder.process"


def test_a_processor_gets_arrays_of_its_own_it_may_change():
    seen = []

    class Doubler:
        def process(self, predictions, worker_id):
            predictions *= 2  # in place: a read-only view of the wire bytes would raise
            seen.append(predictions.tolist())

    sink = PredictionSink(["/data/f1.rec"], 4, processor=Doubler())
    task = _task(start=0, end=3)
    sink.add(task, 0, sink.decode(task, [encode("", np.arange(3, dtype=np.float32))]))
    assert sink.close() == "" and seen == [[0.0, 2.0, 4.0]]


def test_a_processor_that_raises_fails_the_job_naming_the_records():
    processor = _Recorder(fail_at=1)
    sink = PredictionSink(["/data/f1.rec"], 2, processor=processor)
    task, later = _task(start=0, end=4), _task(start=4, end=6)
    sink.add(task, 0, sink.decode(task, [encode("", np.zeros(4, np.float32))]))
    sink.add(later, 0, sink.decode(later, [encode("", np.zeros(2, np.float32))]))
    error = sink.close()
    assert "records [0, 4) of /data/f1.rec" in error and "disk full" in error
    assert sink.records == 0 and len(processor.calls) == 1  # nothing after the failure


def test_a_slow_processor_keeps_no_report_waiting():
    release = threading.Event()

    class Slow:
        def process(self, predictions, worker_id):
            release.wait(10)

    sink = PredictionSink(["/data/f1.rec"], 4, processor=Slow())
    task = _task(start=0, end=4)
    outputs = sink.decode(task, [encode("", np.zeros(4, np.float32))])
    sink.add(task, 0, outputs)  # a worker's report: queued, not processed on its thread
    sink.add(task, 0, outputs)
    assert sink.records == 0  # had add() processed, it would have come back with 4
    release.set()
    assert sink.close() == "" and sink.records == 8


@pytest.mark.parametrize("tensors, complaint", [
    ([], "must carry its predictions"),
    ([encode("", np.zeros(2, np.float32))], "one row per record of the task (3)"),
    ([encode("a", np.zeros(3, np.float32)), encode("a", np.zeros(3, np.float32))],
     "sent twice"),
    ([encode("", np.float32(1.0))], "one row per record"),
])
def test_outputs_that_do_not_fit_the_task_are_refused(tensors, complaint):
    sink = PredictionSink(["/data/f1.rec"], 2, processor=_Recorder())
    with pytest.raises(PayloadError) as raised:
        sink.decode(_task(), tensors)
    assert complaint in str(raised.value)
