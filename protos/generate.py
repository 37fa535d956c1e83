"""Regenerates `elastic_keras/proto/` from the `.proto` files beside this script.

Usage: python protos/generate.py [OUTPUT_ROOT]   (default: the repository root)
"""

import pathlib
import sys

from grpc_tools import protoc

PROTO_ROOT = pathlib.Path(__file__).resolve().parent


def generate(output_root):
    """Compiles every .proto under protos/ into `output_root/elastic_keras/proto/`."""
    output_root = pathlib.Path(output_root)
    (output_root / "elastic_keras" / "proto").mkdir(parents=True, exist_ok=True)
    protos = sorted(str(p) for p in PROTO_ROOT.rglob("*.proto"))
    include = str(pathlib.Path(protoc.__file__).parent / "_proto")
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_ROOT}",
            f"-I{include}",
            f"--python_out={output_root}",
            f"--pyi_out={output_root}",
            f"--grpc_python_out={output_root}",
            *protos,
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with exit status {status}")


if __name__ == "__main__":
    generate(sys.argv[1] if len(sys.argv) > 1 else PROTO_ROOT.parent)
