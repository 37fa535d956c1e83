"""The pod statuses the fake kubelet reports: bodies for `patch_namespaced_pod_status`.

Each is a whole `status` as a real kubelet would leave it, with every field the official
client's models require (a container status needs name, image, imageID, ready and
restartCount), so a typed `read_namespaced_pod` accepts it. kmock merges dicts and replaces
lists, so `conditions` and `containerStatuses` are always sent whole.
"""

import datetime

from tests.engines.pod_launch import LOOPBACK

OOM_KILLED = "OOMKilled"
PREEMPTED = "Preempted"
PREEMPTED_MESSAGE = "Preempted in order to admit critical pod (the fake kubelet's preempt())"


def now():
    """The current time as Kubernetes writes it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def unschedulable(message):
    """Pending, not scheduled: what `hold_pending` keeps a pod at."""
    return {"phase": "Pending",
            "conditions": [_condition("PodScheduled", False, "Unschedulable", message)]}


def config_error(launch_error, container, image):
    """Pending with the container waiting: the env or command could not be resolved."""
    waiting = {"reason": launch_error.reason, "message": str(launch_error)}
    return {"phase": "Pending",
            "conditions": [_condition("PodScheduled", True), _condition("Ready", False)],
            "containerStatuses": [_container(container, image, {"waiting": waiting})]}


def start_error(message, container, image):
    """Failed without running: the program could not be executed (restartPolicy Never)."""
    state = {"terminated": {"exitCode": 128, "reason": "StartError", "message": message,
                            "finishedAt": now()}}
    return {"phase": "Failed", "hostIP": LOOPBACK,
            "conditions": [_condition("PodScheduled", True), _condition("Ready", False)],
            "containerStatuses": [_container(container, image, state)]}


def running(container, image, started_at, disrupted=False):
    """Running on 127.0.0.1; `disrupted` adds the DisruptionTarget condition of a preemption."""
    conditions = [_condition("PodScheduled", True), _condition("Ready", True)]
    if disrupted:
        conditions.append(_disruption())
    state = {"running": {"startedAt": started_at}}
    return {"phase": "Running", "podIP": LOOPBACK, "podIPs": [{"ip": LOOPBACK}],
            "hostIP": LOOPBACK, "startTime": started_at, "conditions": conditions,
            "containerStatuses": [_container(container, image, state, ready=True)]}


def terminated(container, image, started_at, returncode, cause=None):
    """Ended: Succeeded on exit 0, else Failed with the exit code (128+N after signal N).

    Args:
        returncode: `Popen.returncode` (negative for a death by signal).
        cause: None, OOM_KILLED (reason and exit code 137 of the kernel's OOM killer) or
            PREEMPTED (phase Failed whatever the exit code, pod reason Preempted and the
            DisruptionTarget condition).
    """
    exit_code = 128 - returncode if returncode < 0 else returncode
    if cause == OOM_KILLED:
        reason = OOM_KILLED
    else:
        reason = "Completed" if exit_code == 0 else "Error"
    ended = {"exitCode": exit_code, "reason": reason, "startedAt": started_at,
             "finishedAt": now()}
    if returncode < 0:
        ended["signal"] = -returncode
    conditions = [_condition("PodScheduled", True),
                  _condition("Ready", False, "PodCompleted")]
    status = {"phase": "Succeeded" if exit_code == 0 and cause is None else "Failed",
              "podIP": LOOPBACK, "podIPs": [{"ip": LOOPBACK}], "hostIP": LOOPBACK,
              "startTime": started_at, "conditions": conditions,
              "containerStatuses": [_container(container, image, {"terminated": ended})]}
    if cause == PREEMPTED:
        conditions.append(_disruption())
        status.update(reason=PREEMPTED, message=PREEMPTED_MESSAGE)
    return status


def _disruption():
    return _condition("DisruptionTarget", True, "PreemptionByScheduler", PREEMPTED_MESSAGE)


def _condition(kind, status, reason=None, message=None):
    condition = {"type": kind, "status": "True" if status else "False",
                 "lastTransitionTime": now()}
    if reason:
        condition["reason"] = reason
    if message:
        condition["message"] = message
    return condition


def _container(name, image, state, ready=False):
    return {"name": name, "image": image, "imageID": "", "ready": ready, "started": ready,
            "restartCount": 0, "state": state}
