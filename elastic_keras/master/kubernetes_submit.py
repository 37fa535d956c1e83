"""`elastic-keras train --engine kubernetes`: submits the job's master pod and follows it.

The master pod `<job>-master` runs `python -m elastic_keras.master` with the same flags, so
the same job runs as with local processes; there, the master creates the parameter-server and
worker pods itself. Its roles bind `--host` (give `--host 0.0.0.0 --tls auto` on a real
cluster) and tell each other the pod's IP from the downward API. Unless `--detach`, the
command follows the master pod's log and exits 0 when the pod ends `Succeeded` (the job
succeeded) and 1 otherwise. With `--yaml FILE` it writes every manifest (the master pod and
the pods it would create, their Secrets named but not written: they hold the job's secret,
made when the job starts) instead of submitting.
"""

import dataclasses
import sys
import threading
import time

from elastic_keras.common import tls
from elastic_keras.common.config import to_argv
from elastic_keras.common.errors import ConfigError
from elastic_keras.master.instance_manager.kube_client import api_exception, core_api
from elastic_keras.master.instance_manager.pod_logs import follow_log
from elastic_keras.master.instance_manager.pod_manifests import POD_IP_ENV, PodMaker, pod_name
from elastic_keras.master.roles import Roles

FOLLOW_POLL_S = 2.0


def master_pod(config):
    """The manifest of job `config`'s master pod."""
    maker = PodMaker(config.job_name, config.cluster)
    cluster = dataclasses.replace(config.cluster, detach=False, yaml="")
    # The master binds --port (0: a free one) and tells its roles the pod's IP and that port.
    in_pod = dataclasses.replace(config, cluster=cluster, advertise_host=f"$({POD_IP_ENV})")
    env = [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
           {"name": "PYTHONUNBUFFERED", "value": "1"}]
    pod = maker.pod(pod_name(config.job_name, "master"), "master", 0,
                    ["python", "-m", "elastic_keras.master"], to_argv(in_pod), env,
                    config.cluster.master_pod_priority)
    if config.cluster.service_account:
        pod["spec"]["serviceAccountName"] = config.cluster.service_account
    return pod


def manifests(config):
    """Every manifest of the job: the master pod, then the pods it would create."""
    maker = PodMaker(config.job_name, config.cluster)
    material = tls.TlsMaterial(b"", b"", b"") if config.tls != "off" or config.tls_cert else None
    roles = Roles(config, engine=None, secret=b"", tls_for=lambda name: material)
    roles.master_address = "MASTER_POD_IP:MASTER_PORT"  # known once the master serves
    specs = ([roles.ps_spec(i) for i in range(config.num_ps * config.ensemble_members)]
             + [roles.worker_spec(i) for i in range(config.num_workers)
                if config.job_type != "export"])
    return [master_pod(config)] + [maker.role_pod(s, 0, config.num_workers)[0] for s in specs]


def submit_command(config, stream=None):
    """Writes the manifests (`--yaml`), or submits the master pod and, unless `--detach`,
    follows it; the exit code: 0 the job succeeded (or was submitted), 1 it did not."""
    stream = stream or sys.stderr
    if config.cluster.yaml:
        import yaml
        with open(config.cluster.yaml, "w", encoding="utf-8") as f:
            yaml.safe_dump_all(manifests(config), f, sort_keys=False)
        print(f"Wrote the manifests of job {config.job_name} to {config.cluster.yaml}",
              file=stream)
        return 0
    api = core_api(config.cluster.kubeconfig)
    pod = master_pod(config)
    name, namespace = pod["metadata"]["name"], config.cluster.namespace
    try:
        api.create_namespaced_pod(namespace, pod)
    except api_exception() as exc:
        if exc.status == 409:
            raise ConfigError(f"Pod {name} already exists in namespace {namespace}: a job "
                              f"named {config.job_name} runs or ran there. Choose another "
                              f"--job-name or delete that pod. Received: --job-name "
                              f"{config.job_name}") from exc
        raise ConfigError(f"Cannot create the master pod {name}: {exc.status} {exc.reason}: "
                          f"{(exc.body or '')[:300]}") from exc
    print(f"Submitted job {config.job_name}: master pod {name} in namespace {namespace}",
          file=stream)
    if config.cluster.detach:
        return 0
    return follow(api, namespace, name, config.job_name, stream)


def follow(api, namespace, name, job_name, stream):
    """Prints pod `name`'s log until it ends; 0 if it succeeded, 1 if not (or it vanished)."""
    closed, phase, logging_started = threading.Event(), None, False
    try:
        while True:
            try:
                pod = api.read_namespaced_pod(name, namespace)
            except api_exception() as exc:
                if exc.status == 404:
                    print(f"The master pod {name} was deleted: the job did not finish.",
                          file=stream)
                    return 1
                raise
            now = pod.status.phase if pod.status else None
            if now != phase:
                phase = now
                print(f"Master pod {name}: {phase}", file=stream)
            if phase in ("Running", "Succeeded", "Failed") and not logging_started:
                logging_started = True
                follow_log(api, namespace, name, "master", "",
                           lambda _, line: print(line, file=stream), closed)
            if phase in ("Succeeded", "Failed"):
                time.sleep(FOLLOW_POLL_S)  # the last lines of its log
                outcome = "succeeded" if phase == "Succeeded" else "failed"
                print(f"Job {job_name} {outcome} (its master pod ended {phase})", file=stream)
                return 0 if phase == "Succeeded" else 1
            time.sleep(FOLLOW_POLL_S)
    except KeyboardInterrupt:
        print(f"Stopped following; the job goes on. Delete pod {name} to stop it.",
              file=stream)
        return 130
    finally:
        closed.set()
