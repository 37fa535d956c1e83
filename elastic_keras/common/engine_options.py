"""The flags of the engines that run a job's roles beyond this machine (`--engine kubernetes`,
`--engine ray`), held by `JobConfig.cluster`, and the parsing of their list-valued forms.

Resources are engine-neutral: `--worker-resource-request cpu=4,memory=8Gi,gpu=1` asks
Kubernetes for those requests (`gpu` is `nvidia.com/gpu`) and Ray for `num_cpus=4`,
`memory=8 GiB`, `num_gpus=1`.

Example:

    >>> parse_pairs("cpu=4,memory=8Gi", "--worker-resource-request")
    {'cpu': '4', 'memory': '8Gi'}
    >>> quantity("8Gi", "--worker-resource-request memory")
    8589934592.0
"""

import dataclasses
import re

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.flags import NON_NEGATIVE, check_fields, flag

RESOURCE_NAMES = ("cpu", "memory", "gpu", "ephemeral-storage")
# The engines that read each flag; every other flag is read by Kubernetes alone.
_BOTH = ("kubernetes", "ray")
_ENGINES_OF = {"ray_address": ("ray",), "ps_resource_request": _BOTH,
               "worker_resource_request": _BOTH, "env": _BOTH, "pending_timeout": _BOTH}
_SUFFIXES = {"": 1, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "Ki": 2**10, "Mi": 2**20,
             "Gi": 2**30, "Ti": 2**40, "m": 1e-3}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T|m)?$")


def _resources(role, kind):
    return flag("", help=f"Resources each {role} {kind}s, as name=quantity pairs: "
                f"{', '.join(RESOURCE_NAMES)} (e.g. cpu=4,memory=8Gi,gpu=1).")


@dataclasses.dataclass(frozen=True)
class ClusterOptions:
    """How the Kubernetes and Ray engines place the roles (ignored by the local engine)."""

    namespace: str = flag("default", help="Kubernetes: the namespace of the job's pods.")
    image: str = flag("", help="Kubernetes: the container image of every pod (with "
                      "elastic-keras, TensorFlow and the model zoo installed).")
    kubeconfig: str = flag("", help="Kubernetes: the kubeconfig file when not running in a "
                           "cluster (default: $KUBECONFIG, then ~/.kube/config).")
    image_pull_policy: str = flag("IfNotPresent", choices=("Always", "IfNotPresent", "Never"),
                                  help="Kubernetes: the image pull policy of every pod.")
    service_account: str = flag("", help="Kubernetes: the service account of the master pod "
                                "(it creates, watches and deletes the job's pods; see the "
                                "README's RBAC manifest).")
    master_resource_request: str = _resources("master", "request")
    master_resource_limit: str = _resources("master", "limit")
    ps_resource_request: str = _resources("parameter server", "request")
    ps_resource_limit: str = _resources("parameter server", "limit")
    worker_resource_request: str = _resources("worker", "request")
    worker_resource_limit: str = _resources("worker", "limit")
    master_pod_priority: str = flag("", help="Kubernetes: the master pod's PriorityClass.")
    ps_pod_priority: str = flag("", help="Kubernetes: the parameter servers' PriorityClass.")
    worker_pod_priority: str = flag(
        "", help="Kubernetes: the workers' PriorityClass, or high=F: a fraction F of the "
        "workers gets PriorityClass 'high', the rest 'low' (both must exist). Empty: the "
        "cluster's default, below the classes system pods have, so workers are preempted first."
    )
    volume: str = flag(
        "", help="Kubernetes: volumes mounted in every pod at the same path as on the "
        "submitting machine, ';'-separated, each claim_name=C,mount_path=P or "
        "host_path=H,mount_path=P (optionally ,sub_path=S,read_only=true).",
    )
    env: str = flag("", help="Kubernetes and Ray: environment variables of every role, "
                    "K=V,K2=V2.")
    node_selector: str = flag("", help="Kubernetes: node labels every pod needs, k=v,k2=v2.")
    tolerations: str = flag(
        "", help="Kubernetes: taints every pod tolerates, ';'-separated, each "
        "key[=value]:effect (e.g. dedicated=ml:NoSchedule).",
    )
    pod_labels: str = flag("", help="Kubernetes: extra labels of every pod, k=v,k2=v2.")
    pod_annotations: str = flag("", help="Kubernetes: annotations of every pod, k=v,k2=v2.")
    scheduler_name: str = flag("", help="Kubernetes: the scheduler of every pod (e.g. "
                               "volcano); default: the cluster's.")
    pod_overlay: str = flag(
        "", help="Kubernetes: a YAML or JSON pod manifest merged into every pod (maps merge "
        "key by key, containers by name, other lists are replaced).",
    )
    pending_timeout: float = flag(
        600.0, bound=NON_NEGATIVE,
        help="Kubernetes and Ray: a role no node can take for this many seconds (its pod "
        "unschedulable, its actor not placed) is removed and handled as a failed role (0: wait "
        "for ever).",
    )
    keep_failed_pods: bool = flag(False, help="Kubernetes: keep pods that failed (for their "
                                  "logs) when the job ends; the others are deleted.")
    detach: bool = flag(False, help="Kubernetes: submit the master pod and return at once.")
    yaml: str = flag("", help="Kubernetes: write every manifest (the master pod and the pods "
                     "it would create) to this file instead of submitting.")
    ray_address: str = flag(
        "", help="Ray: the cluster to run on (its head's host:port, auto, or ray://host:port "
        "through Ray Client); empty: a Ray cluster on this machine (127.0.0.1 only), started "
        "for the job and stopped with it.",
    )

    def __post_init__(self):
        check_fields(self)
        for name in ("master", "ps", "worker"):
            for kind in ("request", "limit"):
                field = f"{name}_resource_{kind}"
                resources(getattr(self, field), "--" + field.replace("_", "-"))
        for field in ("env", "node_selector", "pod_labels", "pod_annotations"):
            parse_pairs(getattr(self, field), "--" + field.replace("_", "-"))

    def check_engine(self, engine):
        """Every flag given here applies to `engine` (a flag another engine reads would be
        silently ignored).

        Raises:
            ConfigError: one does not.
        """
        defaults = ClusterOptions()
        for field in dataclasses.fields(self):
            engines = _ENGINES_OF.get(field.name, ("kubernetes",))
            if engine not in engines and getattr(self, field.name) != getattr(defaults,
                                                                            field.name):
                name = "--" + field.name.replace("_", "-")
                raise ConfigError(
                    f"{name} applies to --engine {' and '.join(engines)} only. Received: "
                    f"{name} {getattr(self, field.name)!r} with --engine {engine}")

    def role_resources(self, role, kind="request"):
        """`{name: quantity text}` that `role` ("master", "ps", "worker") asks for."""
        field = f"{role}_resource_{kind}"
        return resources(getattr(self, field), "--" + field.replace("_", "-"))


def parse_pairs(text, flag_name, separator=","):
    """`"k=v,k2=v2"` as a dict, in order.

    Raises:
        ConfigError: an item is not key=value, or a key repeats.
    """
    pairs = {}
    for item in filter(None, (part.strip() for part in text.split(separator))):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"{flag_name} must be key=value pairs separated by "
                              f"'{separator}'. Received: {item!r} in {text!r}")
        if key.strip() in pairs:
            raise ConfigError(f"{flag_name} names {key.strip()!r} twice. Received: {text!r}")
        pairs[key.strip()] = value.strip()
    return pairs


def resources(text, flag_name):
    """Parsed resource pairs, each name known and each quantity valid."""
    pairs = parse_pairs(text, flag_name)
    for name, value in pairs.items():
        if name not in RESOURCE_NAMES:
            raise ConfigError(f"{flag_name}: resources must be among "
                              f"{', '.join(RESOURCE_NAMES)}. Received: {name}={value}")
        quantity(value, f"{flag_name} {name}")
    return pairs


def quantity(text, what):
    """A Kubernetes quantity ("500m", "8Gi", "2") as a number.

    Raises:
        ConfigError: it is not one.
    """
    match = _QUANTITY.match(text)
    if not match:
        raise ConfigError(f"{what} must be a quantity such as 2, 500m or 8Gi. "
                          f"Received: {text!r}")
    return float(match.group(1)) * _SUFFIXES[match.group(2) or ""]
