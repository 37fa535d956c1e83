"""The manifests of a job's pods (pod_manifests.py, kubernetes_submit.manifests), checked
against the Kubernetes schema offline with kubernetes-validate."""

import base64
import json

import kubernetes_validate
import pytest
import yaml

from elastic_keras.cli import main
from elastic_keras.common.config import JobConfig, parse_argv
from elastic_keras.common.engine_options import ClusterOptions
from elastic_keras.common.errors import ConfigError
from elastic_keras.master.instance_manager import RoleId, RoleSpec, RoleType
from elastic_keras.master.instance_manager.pod_manifests import PodMaker, merge
from elastic_keras.master.kubernetes_submit import manifests

SCHEMA_VERSION = "1.33"
FLAGS = ["--model-def", "deepfm.deepfm", "--model-zoo", "/zoo", "--training-data", "/data/t",
         "--engine", "kubernetes", "--image", "registry.example/me/train:1",
         "--namespace", "ml", "--job-name", "ctr", "--num-workers", "4", "--num-ps", "2",
         "--host", "0.0.0.0", "--tls", "auto", "--output", "/data/out"]


def _job(*flags):
    return parse_argv(JobConfig, FLAGS + list(flags))


def _container(pod):
    return pod["spec"]["containers"][0]


def test_yaml_writes_every_pod_and_each_validates(tmp_path):
    path = tmp_path / "job.yaml"
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(yaml.safe_dump({"spec": {"containers": [
        {"name": "worker", "securityContext": {"runAsNonRoot": True}}]}}))
    assert main(["train"] + FLAGS + ["--yaml", str(path), "--worker-resource-request",
                         "cpu=4,memory=8Gi,gpu=1", "--worker-pod-priority", "high=0.5",
                         "--volume", "claim_name=data,mount_path=/data",
                         "--tolerations", "dedicated=ml:NoSchedule", "--pod-overlay",
                         str(overlay), "--service-account", "trainer"]) == 0
    pods = list(yaml.safe_load_all(path.read_text()))
    names = [p["metadata"]["name"] for p in pods]
    assert names == ["ctr-master", "ctr-ps-0", "ctr-ps-1"] + [f"ctr-worker-{i}"
                                                              for i in range(4)]
    for pod in pods:
        kubernetes_validate.validate(pod, SCHEMA_VERSION, strict=True)
        assert pod["spec"]["restartPolicy"] == "Never"
        assert _container(pod)["command"][:2] == ["python", "-m"]
    master, ps, workers = pods[0], pods[1], pods[3:]
    assert master["spec"]["serviceAccountName"] == "trainer"
    assert "--advertise-host" in _container(master)["args"]
    assert _container(ps)["args"][-2:] == ["--advertise-host", "$(POD_IP)"]
    assert [w["spec"]["priorityClassName"] for w in workers] == ["high", "high", "low", "low"]
    worker = _container(workers[0])
    assert worker["resources"]["requests"] == {"cpu": "4", "memory": "8Gi",
                                               "nvidia.com/gpu": "1"}
    assert worker["securityContext"] == {"runAsNonRoot": True}  # the overlay, merged
    assert worker["volumeMounts"][0]["mountPath"] == "/data"
    # Private data comes from the pod's Secret, never on the command line.
    assert ("--credential-file", "env:EK_CREDENTIAL_FILE") in zip(worker["args"],
                                                                 worker["args"][1:])
    refs = [e["valueFrom"]["secretKeyRef"] for e in worker["env"]
            if "secretKeyRef" in e.get("valueFrom", {})]
    assert {r["name"] for r in refs} == {"ctr-worker-0"} and len(refs) == 4  # + TLS files


def test_a_role_pod_carries_its_data_in_a_secret_and_a_relaunch_gets_a_new_name():
    maker = PodMaker("ctr", _job().cluster)
    spec = RoleSpec(RoleId(RoleType.PS, 1), "elastic_keras.ps", ("--ps-id", "1"),
                    files=(("--secret-file", b"\x00\xffhidden"),),
                    advertise_flag="--advertise-host")
    pod, secret = maker.role_pod(spec, launch=2)
    assert pod["metadata"]["name"] == secret["metadata"]["name"] == "ctr-ps-1-r2"
    assert pod["metadata"]["labels"]["elastic-keras/role"] == "ps"
    assert pod["spec"]["automountServiceAccountToken"] is False
    assert "hidden" not in json.dumps(pod)  # only a reference to the Secret's key
    assert base64.b64decode(secret["stringData"]["secret-file"]) == b"\x00\xffhidden"
    kubernetes_validate.validate(secret, SCHEMA_VERSION, strict=True)


@pytest.mark.parametrize("flags, message", [
    (["--image", ""], "needs --image"),
    (["--job-name", "My_Job"], "--job-name names the job's pods"),
    (["--volume", "claim_name=data"], "--volume: each volume"),
    (["--tolerations", "gpu:Sometimes"], "--tolerations: each is key"),
    (["--worker-pod-priority", "high=2"], "fraction F from 0 to 1"),
    (["--pod-overlay", "/absent.yaml"], "--pod-overlay /absent.yaml: cannot be read"),
])
def test_bad_pod_flags_are_named(flags, message):
    with pytest.raises(ConfigError, match=message):
        manifests(_job(*flags))


@pytest.mark.parametrize("options, message", [
    ({"ps_resource_limit": "cpus=2"}, "--ps-resource-limit: resources must be among"),
    ({"env": "A"}, "--env must be key=value pairs separated by ','. Received: 'A'"),
    ({"pod_labels": "a=1,a=2"}, "--pod-labels names 'a' twice"),
])
def test_bad_pod_flags_are_refused_when_the_flags_are_read(options, message):
    with pytest.raises(ConfigError, match=message):
        ClusterOptions(**options)


@pytest.mark.parametrize("engine, options, message", [
    ("local", {"image": "x:1"}, "--image applies to --engine kubernetes only. Received: "
     "--image 'x:1' with --engine local"),
    ("local", {"env": "A=1"}, "--env applies to --engine kubernetes and ray only"),
    ("kubernetes", {"ray_address": "auto"}, "--ray-address applies to --engine ray only"),
    ("ray", {"namespace": "ml"}, "--namespace applies to --engine kubernetes only"),
])
def test_flags_of_another_engine_are_refused(engine, options, message):
    with pytest.raises(ConfigError, match=message):
        ClusterOptions(**options).check_engine(engine)


def test_flags_of_the_engine_pass():
    ClusterOptions(image="x:1", env="A=1", pending_timeout=5).check_engine("kubernetes")
    ClusterOptions(ray_address="auto", worker_resource_request="cpu=1").check_engine("ray")
    ClusterOptions().check_engine("local")


def test_the_overlay_merges_maps_and_named_lists_and_replaces_other_lists():
    base = {"spec": {"containers": [{"name": "a", "image": "x", "args": ["1"]}],
                     "tolerations": [{"key": "k"}]}}
    overlay = {"spec": {"containers": [{"name": "a", "args": ["2"]}, {"name": "b"}],
                        "tolerations": [{"key": "other"}], "hostNetwork": True}}
    assert merge(base, overlay) == {"spec": {
        "containers": [{"name": "a", "image": "x", "args": ["2"]}, {"name": "b"}],
        "tolerations": [{"key": "other"}], "hostNetwork": True}}


def test_the_rbac_manifest_in_the_readme_validates():
    from tests.conftest import ROOT
    documents = list(yaml.safe_load_all((ROOT / "deploy" / "rbac.yaml").read_text()))
    assert [d["kind"] for d in documents] == ["ServiceAccount", "Role", "RoleBinding"]
    for document in documents:
        kubernetes_validate.validate(document, SCHEMA_VERSION, strict=True)
