"""The generated protocol code is exactly what the .proto files produce."""

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The grpcio-tools release that generated a `_grpc.py` file, written into it as the least
# grpcio it runs on: it differs between releases of the tools, not with the .proto files.
_TOOLS_RELEASE = re.compile(r"^GRPC_GENERATED_VERSION = '[0-9.]+'$", re.MULTILINE)


def _read(path):
    return _TOOLS_RELEASE.sub("GRPC_GENERATED_VERSION = ...", path.read_text())


def test_regenerating_changes_nothing(tmp_path):
    pytest.importorskip("grpc_tools", reason="grpcio-tools (the `test` extra) is not installed")
    # protoc runs in its own process: it must not share one with TensorFlow's protobufs.
    subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), str(tmp_path)],
                   check=True)
    fresh = {p.name: _read(p) for p in (tmp_path / "elastic_keras" / "proto").iterdir()}
    committed = {
        p.name: _read(p)
        for p in (ROOT / "elastic_keras" / "proto").iterdir()
        if p.suffix in (".py", ".pyi") and p.name != "__init__.py"
    }
    assert fresh == committed, "run `python protos/generate.py` and commit the result"
