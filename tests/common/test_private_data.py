import os

import pytest

from elastic_keras.common.errors import ConfigError
from elastic_keras.common.private_data import (
    encode_for_env, env_source, read_private, write_private,
)


def test_private_files_are_written_and_read_owner_only(tmp_path):
    path = str(tmp_path / "secret")
    write_private(path, b"\x01\x02")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert read_private(path, "--secret-file") == b"\x01\x02"
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match=r"--secret-file .*mode 0600.*Received: mode 0644"):
        read_private(path, "--secret-file")
    with pytest.raises(ConfigError, match="--credential-file is required"):
        read_private("", "--credential-file")
    with pytest.raises(ConfigError, match="cannot be read"):
        read_private(str(tmp_path / "absent"), "--secret-file")


def test_private_data_from_the_environment_is_read_once(monkeypatch):
    secret = bytes(range(256))  # any bytes, not only text
    monkeypatch.setenv("EK_TEST_SECRET", encode_for_env(secret))
    assert read_private(env_source("EK_TEST_SECRET"), "--secret-file") == secret
    assert "EK_TEST_SECRET" not in os.environ  # children do not inherit it
    with pytest.raises(ConfigError, match="no variable EK_TEST_SECRET"):
        read_private(env_source("EK_TEST_SECRET"), "--secret-file")


def test_an_environment_variable_that_is_not_base64_is_refused(monkeypatch):
    monkeypatch.setenv("EK_TEST_SECRET", "not base64!")
    with pytest.raises(ConfigError, match=r"--tls-key env:EK_TEST_SECRET must hold base64"):
        read_private(env_source("EK_TEST_SECRET"), "--tls-key")
