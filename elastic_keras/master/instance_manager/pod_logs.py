"""A role pod's output, followed from the Kubernetes log API into the master's console and
`<log_dir>/<role>.log` (appended: every launch of a role in one file, as locally)."""

import json
import logging
import threading

from elastic_keras.master.instance_manager.local import open_role_log

logger = logging.getLogger(__name__)


def follow_log(api, namespace, pod, role_name, log_dir, on_line, closed):
    """Starts a thread that follows `pod`'s log until the pod ends or `closed` is set."""
    thread = threading.Thread(target=_follow, name=f"log-{pod}", daemon=True,
                              args=(api, namespace, pod, role_name, log_dir, on_line, closed))
    thread.start()
    return thread


def _follow(api, namespace, pod, role_name, log_dir, on_line, closed):
    log_file = None
    try:
        log_file = open_role_log(log_dir, role_name)
        response = api.read_namespaced_pod_log(pod, namespace, follow=True,
                                               _preload_content=False)
        pending = b""
        for chunk in response.stream(4096):
            if closed.is_set():
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for raw in lines:
                _emit(raw, role_name, log_file, on_line)
        if pending:
            _emit(pending, role_name, log_file, on_line)
        response.release_conn()
    except Exception as exc:  # the pod is gone, or the API cannot stream logs
        logger.debug("Stopped following the log of pod %s: %s", pod, exc)
    finally:
        if log_file:
            log_file.close()


def _emit(raw, role_name, log_file, on_line):
    line = raw.decode("utf-8", "replace").rstrip("\r")
    if _is_pod_object(line):
        return  # a test API server that answers a log request with the pod itself
    if log_file:
        log_file.write(line + "\n")
        log_file.flush()
    on_line(role_name, line)


def _is_pod_object(line):
    if not line.startswith("{") or '"kind"' not in line:
        return False
    try:
        return json.loads(line).get("kind") == "Pod"
    except ValueError:
        return False
