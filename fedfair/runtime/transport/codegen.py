"""Generate fedfair_pb2.py, fedfair_pb2.pyi and fedfair_pb2_grpc.py from proto/fedfair.proto.

Run ``.venv/bin/python -m fedfair.runtime.transport.codegen`` after editing the schema and
commit the result; tests/runtime/test_proto_generated.py regenerates into a temporary folder
and fails on any difference. Needs the pinned grpcio-tools (a dev dependency); the
runtime never imports this module.
"""

from __future__ import annotations

import sys
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[3]
PROTO_DIR = REPOSITORY / "proto"
PROTO_FILE = "fedfair.proto"
PACKAGE_DIR = Path(__file__).resolve().parent
GENERATED = ("fedfair_pb2.py", "fedfair_pb2.pyi", "fedfair_pb2_grpc.py")
# protoc writes a top-level import; the modules live in the fedfair.runtime.transport package.
_PLAIN_IMPORT = "import fedfair_pb2 as fedfair__pb2\n"
_PACKAGE_IMPORT = "from fedfair.runtime.transport import fedfair_pb2 as fedfair__pb2\n"


def generate(out_dir: Path) -> list[Path]:
    """Run the pinned protoc into ``out_dir`` and fix the generated import; return the files."""
    from grpc_tools import protoc  # dev dependency, imported only here

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    include = Path(protoc.__file__).resolve().parent / "_proto"
    status = protoc.main(
        [
            "grpc_tools.protoc",
            f"-I{PROTO_DIR}",
            f"-I{include}",
            f"--python_out={out_dir}",
            f"--pyi_out={out_dir}",
            f"--grpc_python_out={out_dir}",
            str(PROTO_DIR / PROTO_FILE),
        ]
    )
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status} on {PROTO_DIR / PROTO_FILE}")
    grpc_module = out_dir / "fedfair_pb2_grpc.py"
    text = grpc_module.read_text()
    if _PLAIN_IMPORT not in text:
        raise RuntimeError(f"unexpected protoc output in {grpc_module}: no line {_PLAIN_IMPORT.strip()!r}")
    grpc_module.write_text(text.replace(_PLAIN_IMPORT, _PACKAGE_IMPORT))
    return [out_dir / name for name in GENERATED]


if __name__ == "__main__":
    for path in generate(Path(sys.argv[1]) if len(sys.argv) > 1 else PACKAGE_DIR):
        print(f"wrote {path}")
