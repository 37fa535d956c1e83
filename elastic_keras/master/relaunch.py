"""The master's policy for a role that exits before the end: relaunch, re-queue, give up.

- A worker that exits (killed, crashed, preempted) has its tasks re-queued from their last
  reported record and is relaunched up to `--relaunch-on-worker-failure` times (a
  preemption the engine reports as such does not count: it is not the worker's failure);
  past that the job carries on with the workers it has, and fails only when none is left.
  A worker scaled away (`scaling`) leaves: its tasks are re-queued, nothing more.
- A parameter server that exits is relaunched up to `--relaunch-on-ps-failure` times,
  restoring its shard from the latest complete checkpoint (evaluate, predict: its model's),
  with the learning rate the callbacks set; workers retry through the gap and learn its
  address (on its old port where it can take it) from the master.
"""

import collections
import logging

from elastic_keras.master.instance_manager import ExitReason, RoleType

logger = logging.getLogger(__name__)


class RoleExitPolicy:
    """Handles the exits of one job's roles.

    Attributes:
        counts: relaunches per role name (`Counter`), a resumed job's earlier runs included.
        exits: the `RoleExit`s handled in this run.

    Args:
        master: the `Master`: its config, roles, membership, tasks, checkpoints, the
            checkpoint each model starts from (`members`) and its callbacks' learning rate.
    """

    def __init__(self, master):
        self._master = master
        self.counts = collections.Counter()
        self.exits = []

    def handle(self, exit_):
        """Acts on `exit_`; returns why the job must fail now, or ""."""
        master, role = self._master, exit_.role
        if role.type == RoleType.WORKER and role.index in master.roles.leaving:
            master.roles.leaving.discard(role.index)
            master.membership.forget_worker(role.index)
            lost = master.tasks.recover_worker(role.index)
            logger.info("%s left the job (%s)%s", role, exit_.describe(),
                        f"; {lost} of its tasks re-queued" if lost else "")
            return ""
        if master.reports.no_more_tasks and exit_.succeeded:
            return ""
        self.exits.append(exit_)
        if role.type == RoleType.PS:
            return self._ps_exited(exit_)
        return self._worker_exited(exit_)

    def _worker_exited(self, exit_):
        master, role = self._master, exit_.role
        master.membership.forget_worker(role.index)
        lost = master.tasks.recover_worker(role.index)
        how = "left without being asked (preempted?)" if exit_.succeeded else exit_.describe()
        budget = master.config.relaunch_on_worker_failure
        if exit_.reason == ExitReason.PREEMPTED:  # the cluster's doing: not a failure
            master.roles.start_worker(role.index)
            logger.warning("%s %s; %d of its tasks re-queued; relaunched it", role, how, lost)
        elif self.counts[role.name] < budget:
            self.counts[role.name] += 1
            master.roles.start_worker(role.index)
            logger.warning("%s %s; %d of its tasks re-queued; relaunched it (%d of %d)",
                           role, how, lost, self.counts[role.name], budget)
        else:
            logger.warning("%s %s; %d of its tasks re-queued; not relaunched: it has been "
                           "relaunched %d times (--relaunch-on-worker-failure)", role, how,
                           lost, budget)
        if not master.roles.count(RoleType.WORKER):
            return f"every worker has exited; the last, {role}, {exit_.describe()}"
        return ""

    def _ps_exited(self, exit_):
        master, role = self._master, exit_.role
        master.membership.ps_exited(role.index)
        budget = master.config.relaunch_on_ps_failure
        if self.counts[role.name] >= budget:
            return (f"{role} {exit_.describe()} and has been relaunched {budget} times "
                    "(--relaunch-on-ps-failure); see its log")
        self.counts[role.name] += 1
        _, addresses = master.membership.ps_addresses()
        port = int(addresses[role.index].rsplit(":", 1)[1]) if addresses else 0
        member = master.members[role.index // master.config.num_ps]
        restore = (master.checkpoints.latest() or member) if master.outputs.trains else member
        rate = master.callbacks.model.optimizer.set_rate
        # Its version goes on from the highest it reported, not back to the checkpoint's.
        master.roles.start_ps(role.index, port, restore, master.membership.ps_version(role.index),
                              -1.0 if rate is None else rate)
        logger.warning(
            "%s %s; relaunched it (%d of %d)%s, %s. Workers wait for it.", role,
            exit_.describe(), self.counts[role.name], budget,
            f" on port {port}" if port else " before every shard had registered",
            f"restoring {restore}" if restore else
            "with no checkpoint to restore: workers re-initialise its dense variables from "
            "their copies, and its embedding rows start again from their initial values",
        )
        return ""
