"""The package's layering, read from the imports of every module (with `ast`).

`master/`, `worker/` and `ps/` are rooms that never import each other (they meet only over
gRPC); `common/` (on `proto/`) and `data/` (on `common/`) import no room; `layers/` (what
users put in their models) stands on `common/` alone, and the worker and the master (to
export) use it. Only `cli`, `api` and `__main__` sit on top.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "elastic_keras"
ROOMS = ("master", "worker", "ps")
TOP = ("cli", "api", "__main__")
# What each part of the package may import of the package (besides itself).
ALLOWED = {
    "master": {"common", "data", "proto", "layers"},  # export turns the layers into TF
    "worker": {"common", "data", "proto", "layers"},
    "ps": {"common", "proto"},
    "common": {"proto"},
    "data": {"common", "proto"},
    "layers": {"common"},
    "proto": set(),
}


def _part(path):
    return path.relative_to(PACKAGE).with_suffix("").parts[0]


def _imported_parts(path):
    """The top-level parts of `elastic_keras` that the module at `path` imports."""
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            names += [f"{node.module}.{alias.name}" for alias in node.names]
    parts = set()
    for name in names:
        if name.startswith("elastic_keras."):
            parts.add(name.split(".")[1])
        elif name == "elastic_keras":
            parts.add("")
    return parts


def _modules():
    return sorted(p for p in PACKAGE.rglob("*.py") if "proto" not in p.relative_to(PACKAGE).parts
                  or not p.name.endswith(("_pb2.py", "_pb2_grpc.py")))


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_module_imports_only_what_its_part_may(path):
    part = _part(path)
    if part in TOP or part == "__init__":
        return
    allowed = ALLOWED[part] | {part, ""}
    wrong = _imported_parts(path) - allowed
    assert not wrong, (f"elastic_keras/{path.relative_to(PACKAGE)} ({part}) imports "
                       f"{sorted(wrong)}; {part} may import only {sorted(ALLOWED[part])}")


def test_the_rules_cover_every_part_of_the_package():
    parts = {_part(p) for p in PACKAGE.rglob("*.py")} - set(TOP) - {"__init__"}
    assert parts == set(ALLOWED), sorted(parts ^ set(ALLOWED))


def test_a_room_importing_another_room_is_caught(tmp_path):
    module = tmp_path / "bad.py"
    module.write_text("from elastic_keras.worker.trainer import Trainer\n"
                      "import elastic_keras.ps.parameters\n")
    assert _imported_parts(module) == {"worker", "ps"}
