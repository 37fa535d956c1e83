"""The pods of a job on Kubernetes, as manifests (plain dicts the official client accepts).

`PodMaker` turns a `RoleSpec` into a pod and the Secret holding its private data: the
container runs `python -m <module> <args>` (a program on the image's PATH), private data
reaches it as `env:` variables from the Secret (`secretKeyRef`, never a mounted file), and a
serving role is told the pod's IP from the downward API. The master pod is made the same way
by `elastic-keras train --engine kubernetes`. Every pod has `restartPolicy: Never` (the
master decides what is relaunched) and the labels `LABEL_JOB`, `LABEL_ROLE`, `LABEL_INDEX`.
"""

import copy
import json
import os

from elastic_keras.common.engine_options import parse_pairs
from elastic_keras.common.errors import ConfigError
from elastic_keras.common.private_data import encode_for_env, env_name, env_source

LABEL_APP = "app.kubernetes.io/name"
LABEL_JOB = "elastic-keras/job"
LABEL_ROLE = "elastic-keras/role"
LABEL_INDEX = "elastic-keras/index"
POD_IP_ENV = "POD_IP"
GPU_RESOURCE = "nvidia.com/gpu"
HIGH_PRIORITY, LOW_PRIORITY = "high", "low"


def pod_name(job_name, role_name, launch=0):
    """`<job>-<role>`; a relaunch gets a new name, `<job>-<role>-r<launch>`."""
    return f"{job_name}-{role_name}" + (f"-r{launch}" if launch else "")


def dns_label(job_name):
    """Whether `job_name` can name pods: lower-case letters, digits and '-'."""
    return bool(job_name) and len(job_name) <= 40 and all(
        c.islower() or c.isdigit() or c == "-" for c in job_name
    ) and job_name[0].isalnum() and job_name[-1].isalnum()


class PodMaker:
    """Makes the manifests of job `job_name`'s pods from the `ClusterOptions` `options`.

    Raises (at construction):
        ConfigError: no --image, a job name that cannot name pods, or a bad list-valued flag
            (volumes, tolerations, the overlay file).
    """

    def __init__(self, job_name, options):
        if not options.image:
            raise ConfigError("--engine kubernetes needs --image: the container image every "
                              "pod runs. Received: none")
        if not dns_label(job_name):
            raise ConfigError("--job-name names the job's pods on Kubernetes: at most 40 "
                              "lower-case letters, digits and '-', starting and ending with a "
                              f"letter or digit. Received: {job_name!r}")
        self.job_name, self.options = job_name, options
        self.namespace = options.namespace
        self._volumes, self._mounts = _volumes(options.volume)
        self._tolerations = _tolerations(options.tolerations)
        self._env = [{"name": k, "value": v}
                     for k, v in parse_pairs(options.env, "--env").items()]
        self._overlay = _overlay(options.pod_overlay)
        self.owner = None  # the master pod's ownerReference, when known

    def labels(self, role_type, index):
        return {**parse_pairs(self.options.pod_labels, "--pod-labels"),
                LABEL_APP: "elastic-keras", LABEL_JOB: self.job_name,
                LABEL_ROLE: role_type, LABEL_INDEX: str(index)}

    def role_pod(self, spec, launch=0, num_workers=1):
        """The pod and Secret (None without private data) that run `spec`."""
        role_type, index = spec.role.type.value, spec.role.index
        name = pod_name(self.job_name, spec.name, launch)
        args, env = list(spec.args), [{"name": "PYTHONUNBUFFERED", "value": "1"}]
        secret = None
        if spec.files:
            secret = self._secret(name, role_type, index, spec.files)
            for flag, _ in spec.files:
                variable = env_name(flag)
                env.append({"name": variable, "valueFrom": {"secretKeyRef": {
                    "name": name, "key": _key(flag)}}})
                args += [flag, env_source(variable)]
        if spec.advertise_flag:
            args += [spec.advertise_flag, f"$({POD_IP_ENV})"]
        priority = self._priority(role_type, index, num_workers)
        pod = self.pod(name, role_type, index, ["python", "-m", spec.module], args, env,
                       priority)
        pod["spec"]["automountServiceAccountToken"] = False  # roles never call the API
        return pod, secret

    def pod(self, name, role_type, index, command, args, env=(), priority=""):
        """A pod running `command args` as role `role_type` number `index`."""
        resources = {}
        for kind in ("request", "limit"):
            wanted = self.options.role_resources(role_type, kind)
            if wanted:
                resources[kind + "s"] = {GPU_RESOURCE if k == "gpu" else k: v
                                         for k, v in wanted.items()}
        container = {
            "name": role_type, "image": self.options.image,
            "imagePullPolicy": self.options.image_pull_policy,
            "command": list(command), "args": [str(a) for a in args],
            "env": [{"name": POD_IP_ENV, "valueFrom": {"fieldRef": {
                "fieldPath": "status.podIP"}}}, *env, *self._env],
            "resources": resources, "volumeMounts": copy.deepcopy(self._mounts),
        }
        spec = {"restartPolicy": "Never", "containers": [container],
                "volumes": copy.deepcopy(self._volumes),
                "tolerations": copy.deepcopy(self._tolerations),
                "nodeSelector": parse_pairs(self.options.node_selector, "--node-selector")}
        for key, value in (("priorityClassName", priority),
                           ("schedulerName", self.options.scheduler_name)):
            if value:
                spec[key] = value
        metadata = {"name": name, "namespace": self.namespace,
                    "labels": self.labels(role_type, index),
                    "annotations": parse_pairs(self.options.pod_annotations,
                                               "--pod-annotations")}
        if self.owner:
            metadata["ownerReferences"] = [dict(self.owner)]
        return merge({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec},
                     self._overlay)

    def _priority(self, role_type, index, num_workers):
        value = getattr(self.options, f"{role_type}_pod_priority")
        if role_type != "worker" or not value.startswith(f"{HIGH_PRIORITY}="):
            return value
        fraction = worker_high_fraction(value)
        return HIGH_PRIORITY if index < round(fraction * num_workers) else LOW_PRIORITY

    def _secret(self, name, role_type, index, files):
        metadata = {"name": name, "namespace": self.namespace,
                    "labels": self.labels(role_type, index)}
        if self.owner:
            metadata["ownerReferences"] = [dict(self.owner)]
        return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
                "stringData": {_key(flag): encode_for_env(data) for flag, data in files}}


def worker_high_fraction(value):
    """F of `--worker-pod-priority high=F`.

    Raises:
        ConfigError: F is not a number in [0, 1].
    """
    try:
        fraction = float(value.partition("=")[2])
    except ValueError:
        fraction = -1.0
    if not 0.0 <= fraction <= 1.0:
        raise ConfigError("--worker-pod-priority high=F needs a fraction F from 0 to 1. "
                          f"Received: {value!r}")
    return fraction


def merge(base, overlay):
    """`overlay` merged into a copy of `base`: maps key by key, lists of named maps (containers,
    volumes, env) by name, other lists replaced."""
    if isinstance(base, dict) and isinstance(overlay, dict):
        merged = dict(base)
        for key, value in overlay.items():
            merged[key] = merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if (isinstance(base, list) and isinstance(overlay, list)
            and all(isinstance(x, dict) and "name" in x for x in base + overlay)):
        by_name = {item["name"]: item for item in base}
        merged = [merge(item, next((o for o in overlay if o["name"] == item["name"]), {}))
                  for item in base]
        return merged + [copy.deepcopy(o) for o in overlay if o["name"] not in by_name]
    return copy.deepcopy(overlay)


def _key(flag):
    return flag.lstrip("-")


def _volumes(text):
    volumes, mounts = [], []
    for i, item in enumerate(filter(None, (part.strip() for part in text.split(";")))):
        pairs = parse_pairs(item, "--volume")
        unknown = set(pairs) - {"claim_name", "host_path", "mount_path", "sub_path", "read_only"}
        if unknown or "mount_path" not in pairs or ("claim_name" in pairs) == (
                "host_path" in pairs):
            raise ConfigError("--volume: each volume is claim_name=C,mount_path=P or "
                              "host_path=H,mount_path=P (optionally sub_path, read_only). "
                              f"Received: {item!r}")
        name = f"volume-{i}"
        source = ({"persistentVolumeClaim": {"claimName": pairs["claim_name"]}}
                  if "claim_name" in pairs else {"hostPath": {"path": pairs["host_path"]}})
        volumes.append({"name": name, **source})
        mount = {"name": name, "mountPath": pairs["mount_path"],
                 "readOnly": pairs.get("read_only", "false").lower() == "true"}
        if pairs.get("sub_path"):
            mount["subPath"] = pairs["sub_path"]
        mounts.append(mount)
    return volumes, mounts


def _tolerations(text):
    tolerations = []
    for item in filter(None, (part.strip() for part in text.split(";"))):
        taint, colon, effect = item.rpartition(":")
        key, equals, value = taint.partition("=")
        if not colon or not key or effect not in ("NoSchedule", "PreferNoSchedule",
                                                  "NoExecute"):
            raise ConfigError("--tolerations: each is key[=value]:effect with effect "
                              f"NoSchedule, PreferNoSchedule or NoExecute. Received: {item!r}")
        toleration = {"key": key, "operator": "Equal" if equals else "Exists",
                      "effect": effect}
        if equals:
            toleration["value"] = value
        tolerations.append(toleration)
    return tolerations


def _overlay(path):
    if not path:
        return {}
    try:
        with open(os.path.expanduser(path), encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError(f"--pod-overlay {path}: cannot be read: {exc.strerror}") from exc
    try:
        import yaml  # PyYAML comes with the kubernetes client
        overlay = yaml.safe_load(text)
    except ImportError:
        overlay = json.loads(text)
    except Exception as exc:  # yaml.YAMLError
        raise ConfigError(f"--pod-overlay {path} must be a YAML or JSON pod manifest: "
                          f"{exc}") from exc
    if not isinstance(overlay, dict):
        raise ConfigError(f"--pod-overlay {path} must hold one mapping (a pod manifest). "
                          f"Received: {type(overlay).__name__}")
    return overlay
