"""The heartbeat and task-timeout watchdog: kills roles that stopped answering.

A parameter server or worker silent for longer than its `--*-heartbeat-timeout`, and a
worker holding a task past the task queue's adaptive timeout, is killed; its exit is then
handled by the master's policy like any other (tasks re-queued, the role relaunched).
"""

import logging

from elastic_keras.master.instance_manager import RoleType

logger = logging.getLogger(__name__)


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
