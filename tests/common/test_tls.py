"""TLS between roles (common/tls.py): a job's own CA, mutual authentication over loopback,
the user's files, and which hosts count as loopback."""

import grpc
import pytest

from elastic_keras.common import rpc, tls
from elastic_keras.common.errors import ConfigError
from elastic_keras.proto import master_pb2, master_pb2_grpc


class Cluster(master_pb2_grpc.MasterServicer):
    def GetCluster(self, request, context):
        return master_pb2.GetClusterResponse(ready=True, ps_addresses=["127.0.0.1:1"])


@pytest.fixture(scope="module")
def authority():
    return tls.JobAuthority.create("tls test/job")


@pytest.fixture
def server(authority):
    server, port = rpc.create_server(
        [lambda s: master_pb2_grpc.add_MasterServicer_to_server(Cluster(), s)],
        tls=authority.issue("master"))
    yield f"127.0.0.1:{port}"
    server.stop(grace=None)


def ask(address, material):
    channel = rpc.create_channel(address, "elastic_keras.Master", deadline_s=3.0, tls=material)
    try:
        return master_pb2_grpc.MasterStub(channel).GetCluster(master_pb2.GetClusterRequest())
    finally:
        channel.close()


def test_roles_of_one_job_talk_over_mutual_tls_by_the_jobs_name(authority, server):
    material = authority.issue("worker-0")
    assert material.target_name == "tls-test-job.elastic-keras"
    assert [flag for flag, _ in material.files()] == ["--tls-ca", "--tls-cert", "--tls-key"]
    assert ask(server, material).ready


def test_a_certificate_of_another_jobs_ca_or_none_is_refused(server):
    stranger = tls.JobAuthority.create("tls test/job").issue("worker-0")  # same name, other CA
    for material in (stranger, None):
        with pytest.raises(grpc.RpcError) as refused:
            ask(server, material)
        assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE,
                                        grpc.StatusCode.DEADLINE_EXCEEDED)


def test_the_users_files_are_read_and_bad_ones_named(tmp_path, authority):
    material = authority.issue("ps-0")
    paths = []
    for name, data in (("ca.pem", material.ca), ("cert.pem", material.cert),
                       ("key.pem", material.key)):
        (tmp_path / name).write_bytes(data)
        paths.append(str(tmp_path / name))
    assert tls.from_files(*paths) == tls.TlsMaterial(material.ca, material.cert, material.key)
    (tmp_path / "cert.pem").write_text("not a certificate")
    with pytest.raises(ConfigError, match=r"--tls-cert .*cert.pem must hold PEM"):
        tls.from_files(*paths)
    with pytest.raises(ConfigError, match=r"--tls-ca .*absent.pem: cannot be read"):
        tls.from_files(str(tmp_path / "absent.pem"), *paths[1:])


@pytest.mark.parametrize("host, loopback", [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("10.0.0.5", False), ("::", False), ("example.org", False),
])
def test_which_hosts_are_loopback(host, loopback):
    assert tls.is_loopback(host) == loopback
