"""The generated protocol code is exactly what the .proto files produce."""

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_regenerating_changes_nothing(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the `test` extra) is not installed")
    # protoc runs in its own process: it must not share one with TensorFlow's protobufs.
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), str(tmp_path)],
                   check=True)
    fresh = {p.name: p.read_text() for p in (tmp_path / "elastic_keras" / "proto").iterdir()}
    committed = {
        p.name: p.read_text()
        for p in (ROOT / "elastic_keras" / "proto").iterdir()
        if p.suffix in (".py", ".pyi") and p.name != "__init__.py"
    }
    assert fresh == committed, "run `python protos/generate.py` and commit the result"
