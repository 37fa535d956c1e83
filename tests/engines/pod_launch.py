"""How the fake kubelet turns a pod's first container into a local command: argv and environment.

Only what elastic_keras' pods use is understood: `command` + `args` (no image entrypoint),
`env` with plain values, `fieldRef`, `secretKeyRef` and `configMapKeyRef`, and Kubernetes'
`$(VAR)` expansion. Anything else in `valueFrom` fails the start, as an unresolvable reference
fails it on a real kubelet.
"""

import base64
import dataclasses
import os
import re
import sys

LOOPBACK = "127.0.0.1"
NODE_NAME = "fake-node"
_REFERENCE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_PYTHONS = ("python", "python3")


class LaunchError(Exception):
    """The container cannot start; a real kubelet would report `reason` with this message."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


@dataclasses.dataclass(frozen=True)
class Launch:
    """What to run for one pod: its first container's name and image, argv and environment."""
    container: str
    image: str
    argv: list
    env: dict


def expand(text, variables):
    """Kubernetes' `$(VAR)` expansion: a defined VAR is replaced, a reference to an undefined
    one stays as written, and `$$` is a literal `$` (so `$$(VAR)` gives `$(VAR)`).

    >>> expand("$(POD_IP):$(PORT) $(NOPE) $$(POD_IP)", {"POD_IP": "127.0.0.1", "PORT": "80"})
    '127.0.0.1:80 $(NOPE) $(POD_IP)'
    """
    def replace(match):
        if match.group(0) == "$$":
            return "$"
        return variables.get(match.group(1), match.group(0))
    return _REFERENCE.sub(replace, text)


def launch_for(pod, namespace, kubeconfig, read_object):
    """The `Launch` of `pod`'s first container.

    Args:
        pod: the pod as a raw API dict.
        namespace: the pod's namespace.
        kubeconfig: path set as `KUBECONFIG` in the process (the container's env may override).
        read_object: `read_object(kind, name)` -> the raw "secret" or "configmap" dict, or None
            when there is none.

    Raises:
        LaunchError: the container has no `command`, or its env cannot be resolved.
    """
    container = pod["spec"]["containers"][0]
    if not container.get("command"):
        raise LaunchError("CreateContainerError", (
            f"container {container['name']!r} has no command; the fake kubelet runs "
            f"programs on PATH, not an image's entrypoint"))
    variables = container_env(pod, namespace, container, read_object)
    argv = [expand(arg, variables) for arg in container["command"] + container.get("args", [])]
    if argv[0] in _PYTHONS:
        argv[0] = sys.executable
    env = {**os.environ, "KUBECONFIG": str(kubeconfig), **variables}
    return Launch(container["name"], container.get("image", ""), argv, env)


def container_env(pod, namespace, container, read_object):
    """{name: value} of the container's `env`, in order; a value may refer to earlier ones."""
    variables = {}
    for var in container.get("env") or []:
        if "valueFrom" not in var:
            variables[var["name"]] = expand(var.get("value", ""), variables)
            continue
        value = _value_from(pod, namespace, var, read_object)
        if value is not None:
            variables[var["name"]] = value
    return variables


def _value_from(pod, namespace, var, read_object):
    source = var["valueFrom"]
    if "fieldRef" in source:
        return _field(pod, namespace, source["fieldRef"]["fieldPath"])
    for kind, ref_name in (("secret", "secretKeyRef"), ("configmap", "configMapKeyRef")):
        if ref_name in source:
            ref = source[ref_name]
            value = object_key(kind, read_object(kind, ref["name"]), ref["key"])
            if value is None and not ref.get("optional"):
                raise LaunchError("CreateContainerConfigError", (
                    f"env {var['name']!r}: {kind} {ref['name']!r} has no key {ref['key']!r} "
                    f"in namespace {namespace!r}"))
            return value
    raise LaunchError("CreateContainerConfigError", (
        f"env {var['name']!r}: the fake kubelet supports fieldRef, secretKeyRef and "
        f"configMapKeyRef. Received: valueFrom={source!r}"))


def object_key(kind, obj, key):
    """The text under `key` of a raw Secret (`stringData`, else base64 `data`) or ConfigMap
    (`data`), or None when the object or the key is absent."""
    if obj is None:
        return None
    if kind == "secret":
        if key in (obj.get("stringData") or {}):
            return obj["stringData"][key]
        encoded = (obj.get("data") or {}).get(key)
        return None if encoded is None else base64.b64decode(encoded).decode("utf-8")
    return (obj.get("data") or {}).get(key)


def _field(pod, namespace, path):
    metadata = pod["metadata"]
    fields = {
        "status.podIP": LOOPBACK,
        "status.hostIP": LOOPBACK,
        "metadata.name": metadata["name"],
        "metadata.namespace": namespace,
        "metadata.uid": metadata.get("uid", ""),
        "spec.nodeName": NODE_NAME,
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", "default"),
    }
    if path not in fields:
        raise LaunchError("CreateContainerConfigError", (
            f"fieldRef must be one of {sorted(fields)}. Received: fieldPath={path!r}"))
    return fields[path]
