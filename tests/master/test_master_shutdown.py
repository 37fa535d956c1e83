"""The order in which a job's end stops its roles, with an engine that records each stop.

A worker's last push needs its shards, and a shard leaves once the master says the job has
finished: the workers must be stopped (and gone) before that, on every kind of end. The
roles are not run; the local engine's stopping of processes is tested in
test_local_instance_manager.py, the whole order in a real job in
test_job_behaviour.py::test_a_signal_to_train_stops_every_role.
"""

import io

import pytest

from elastic_keras.common.config import JobConfig
from elastic_keras.common.model_spec import load_model_spec
from elastic_keras.master.console import Console
from elastic_keras.master.instance_manager import RoleId, RoleSpec, RoleType
from elastic_keras.master import master as master_module
from elastic_keras.master.master import Master
from tests.conftest import ROOT
from tests.master.test_master_auth import RecordingEngine


class StopRecordingEngine(RecordingEngine):
    """Runs nothing; records each stop with whether the master had said the job finished."""

    def __init__(self, config=None, on_line=None):
        super().__init__(config, on_line)
        self.stops, self.master = [], None

    def stop(self, role, grace_s):
        self.stops.append((role.name, self.master.job_finished))
        self.started = [s for s in self.started if s.role != role]

    def kill(self, role):
        self.stop(role, 0)

    def stop_all(self, grace_s):
        self.stops += [(s.role.name, self.master.job_finished) for s in self.started]
        self.started = []


@pytest.mark.parametrize("error", ["interrupted (Ctrl-C or SIGTERM)", ""])
def test_workers_are_stopped_before_the_shards_are_told_the_job_finished(error, monkeypatch):
    monkeypatch.setattr(master_module, "ROLE_EXIT_GRACE_S", 0.2)
    spec = load_model_spec(str(ROOT / "model_zoo"), "digits.digits_cnn")
    engine = StopRecordingEngine()
    master = Master(JobConfig(model_def="digits.digits_cnn", training_data="unused", num_ps=1,
                              job_name="shutdown-test"),
                    spec, engine=engine, console=Console(io.StringIO()))
    engine.master = master
    for role in (RoleId(RoleType.PS, 0), RoleId(RoleType.WORKER, 0), RoleId(RoleType.WORKER, 1)):
        engine.start(RoleSpec(role, "unused", ()))
    master._error = error
    master._shutdown(None)
    # A good end waits a while for workers to leave (these never do), then stops them.
    assert sorted(engine.stops) == [("ps-0", True), ("worker-0", False), ("worker-1", False)]
