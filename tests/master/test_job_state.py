"""The job state a checkpoint records (master/job_state.py): a round trip, and what a resume
refuses to read."""

import pytest

from elastic_keras.common.errors import ConfigError
from elastic_keras.master.job_state import JobState


def test_a_job_state_reads_back_what_it_wrote():
    state = JobState("job", {"format": 1}, model_version=7, examples_trained=90,
                     evaluations=[{"epoch": 1}], relaunches={"ps-0": 1},
                     role_exits=[{"role": "ps-0", "exit_code": -9, "reason": "killed"}],
                     finished=True, stopped_early=2)
    data = state.to_json()
    assert data["format"] == 1
    assert JobState.from_json(data, "ckpt-3") == state


@pytest.mark.parametrize("data, message", [
    (None, r"ckpt-3 holds no job state.*Received: 'NoneType'"),
    ({"format": 9, "job_name": "j", "tasks": {}}, r"expected format 1\). Received: 9"),
    ({"format": 1, "tasks": {}}, r"lacks 'job_name' or 'tasks'"),
    ({"format": 1, "job_name": "j", "tasks": {}, "model_version": "7"},
     r"'model_version' must be of type int. Received: '7'"),
    ({"format": 1, "job_name": "j", "tasks": {}, "stopped_early": "2"},
     r"'stopped_early' must be of type int. Received: '2'"),
])
def test_a_state_this_version_cannot_read_is_refused_by_name(data, message):
    with pytest.raises(ConfigError, match=message):
        JobState.from_json(data, "ckpt-3")
