"""Membership: who is silent, and a replaced shard not judged before it registers again."""

from elastic_keras.master import membership as membership_module
from elastic_keras.master.membership import Membership


class Clock:
    def __init__(self):
        self.now = 100.0

    def monotonic(self):
        return self.now


def test_silent_shards_and_workers_and_a_replaced_shard_waits_for_its_registration(
        monkeypatch):
    clock = Clock()
    monkeypatch.setattr(membership_module, "time", clock)
    members = Membership(num_ps=2)
    members.register_ps(0, "127.0.0.1:1")
    members.register_ps(1, "127.0.0.1:2")
    members.register_worker(0)
    clock.now += 5
    members.heartbeat("ps", 1)
    clock.now += 3
    assert members.silent("ps", 6) == [0] and members.silent("worker", 6) == [0]
    assert members.silent("ps", 0) == [0, 1] and members.silent("ps", 8) == []
    members.mark_ps_down(0)  # being replaced: however long its restore takes
    clock.now += 600
    assert members.silent("ps", 6) == [1]
    assert members.ps_addresses() == (True, ["127.0.0.1:1", "127.0.0.1:2"])  # same address
    members.register_ps(0, "127.0.0.1:1")
    clock.now += 7
    assert members.silent("ps", 6) == [0, 1]


def test_shards_answer_once_all_registered_and_none_silent_or_down(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(membership_module.time, "monotonic", lambda: now[0])
    members = Membership(2)
    members.register_ps(0, "127.0.0.1:1")
    assert not members.shards_answering(6.0)  # ps-1 has not registered
    members.register_ps(1, "127.0.0.1:2")
    assert members.shards_answering(6.0)
    now[0] += 5.0
    members.heartbeat("ps", 0)
    now[0] += 2.0
    assert not members.shards_answering(6.0)  # ps-1 silent for 7 s
    members.heartbeat("ps", 1)
    members.mark_ps_down(0)
    assert not members.shards_answering(6.0)  # ps-0 being replaced
    members.register_ps(0, "127.0.0.1:1")
    assert members.shards_answering(6.0)


def test_non_finite_pushes_add_up_across_shards_and_their_relaunches():
    from elastic_keras.common.config import JobConfig
    from elastic_keras.common.transfer.limits import PayloadLimits
    from elastic_keras.master.watchdog import non_finite_error

    membership = Membership(num_ps=2)
    config = JobConfig(model_def="m", training_data="d", num_ps=2,
                       limits=PayloadLimits(max_non_finite_pushes=4))
    membership.report_version(0, 3, non_finite_pushes=2)
    membership.report_version(1, 3, non_finite_pushes=1)
    assert membership.non_finite_pushes == 3 and non_finite_error(config, membership) == ""
    membership.ps_exited(0)  # relaunched: its replacement counts anew, from any number
    membership.report_version(0, 5, non_finite_pushes=3)
    assert membership.non_finite_pushes == 6
    error = non_finite_error(config, membership)
    assert error.startswith("NonFiniteGradients: the parameter servers received 6 pushes")
    assert "more than --max-non-finite-pushes 4" in error
    unlimited = JobConfig(model_def="m", training_data="d",
                          limits=PayloadLimits(max_non_finite_pushes=0))
    assert non_finite_error(unlimited, membership) == ""
