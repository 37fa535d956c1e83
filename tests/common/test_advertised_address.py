import socket

import pytest

from elastic_keras.common import rpc
from elastic_keras.common.errors import ConfigError


def test_the_address_given_is_advertised_whatever_the_bound_host():
    assert rpc.advertised_address("0.0.0.0", 5000, "10.4.0.7") == "10.4.0.7:5000"
    assert rpc.advertised_address("127.0.0.1", 5000) == "127.0.0.1:5000"
    assert rpc.advertised_address("::1", 5000) == "[::1]:5000"


def test_a_wildcard_host_advertises_what_this_machines_name_resolves_to(monkeypatch):
    monkeypatch.setattr(socket, "gethostbyname", lambda name: "192.0.2.10")
    assert rpc.advertised_address("0.0.0.0", 7) == "192.0.2.10:7"

    def unresolvable(name):
        raise socket.gaierror("no such name")

    monkeypatch.setattr(socket, "gethostbyname", unresolvable)
    with pytest.raises(ConfigError, match="give it with --advertise-host"):
        rpc.advertised_address("0.0.0.0", 7)
