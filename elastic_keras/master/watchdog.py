"""The watchdog: kills roles that stopped answering, and fails a job that trains on NaN.

A parameter server or worker silent for longer than its `--*-heartbeat-timeout`, and a
worker holding a task past the task queue's adaptive timeout, is killed; its exit is then
handled by the master's policy like any other (tasks re-queued, the role relaunched).
Pushes holding NaN or Inf, which the shards refuse or skip and count, fail the job once
there are more than `--max-non-finite-pushes` of them (`non_finite_error`).
"""

import logging

from elastic_keras.master.instance_manager import RoleType

logger = logging.getLogger(__name__)


def watch(config, membership, tasks, roles):
    """One round of the watchdog: `stop_unresponsive_roles`, then returns
    `non_finite_error` (why the job must fail now, or "")."""
    stop_unresponsive_roles(config, membership, tasks, roles)
    return non_finite_error(config, membership)


def stop_unresponsive_roles(config, membership, tasks, roles):
    """Kills the roles that stopped heartbeating and the workers holding overdue tasks
    (whose tasks are re-queued first)."""
    for role, timeout, forget in (
            (RoleType.PS, config.ps_heartbeat_timeout, membership.mark_ps_down),
            (RoleType.WORKER, config.worker_heartbeat_timeout, membership.forget_worker)):
        for index in membership.silent(role.value, timeout) if timeout else ():
            forget(index)
            logger.warning("%s-%d sent no heartbeat for %.0f s (--%s-heartbeat-timeout); "
                           "killing it", role.value, index, timeout, role.value)
            roles.kill(role, index)
    for task_id, worker_id, held_s in tasks.overdue(config.task_timeout_floor):
        tasks.requeue_overdue(task_id)
        logger.warning("worker-%d has held task %d for %.0f s, past the task timeout; "
                       "re-queued the task and killing the worker", worker_id, task_id, held_s)
        roles.kill(RoleType.WORKER, worker_id)


def non_finite_error(config, membership):
    """Why the job must fail for the NaN/Inf pushes the shards counted, or ""."""
    limit = config.limits.max_non_finite_pushes
    count = membership.non_finite_pushes
    if not limit or count <= limit:
        return ""
    return (f"NonFiniteGradients: the parameter servers received {count} pushes holding NaN "
            f"or Inf gradients, more than --max-non-finite-pushes {limit} "
            f"(--non-finite-gradients {config.limits.non_finite_gradients}); the model "
            "diverges: lower the learning rate, clip gradients or check the data")
