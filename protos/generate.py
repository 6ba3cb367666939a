"""Regenerate the checked-in Python modules from zipkv.proto: `python -m zipkv.protos.generate`.

The generated modules are committed so that installing zipkv needs no protoc; tests/test_protos.py
regenerates into a temporary folder and fails when the committed copies differ.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PROTO_DIR = Path(__file__).resolve().parent
PROTO_FILE = "zipkv.proto"


def generate(out_dir: Path) -> list[Path]:
    """Run protoc (grpcio-tools) on zipkv.proto into out_dir; return the files written."""
    from grpc_tools import protoc  # dev-only dependency

    out_dir.mkdir(parents=True, exist_ok=True)
    args = [
        "protoc",
        f"-I{PROTO_DIR}",
        f"--python_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        f"--pyi_out={out_dir}",
        str(PROTO_DIR / PROTO_FILE),
    ]
    if protoc.main(args) != 0:
        raise RuntimeError(f"protoc failed on {PROTO_DIR / PROTO_FILE}")
    grpc_file = out_dir / "zipkv_pb2_grpc.py"
    # protoc writes a top-level import; inside the package it must be relative.
    text = grpc_file.read_text()
    text = re.sub(r"^import zipkv_pb2 as", "from . import zipkv_pb2 as", text, flags=re.M)
    grpc_file.write_text(text)
    return sorted(out_dir.glob("zipkv_pb2*"))


def main() -> int:
    written = generate(PROTO_DIR)
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
