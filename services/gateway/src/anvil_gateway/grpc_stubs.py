"""Generate the gateway's gRPC Python (``anvil_gateway.proto_gen``) from ``proto/grpc_service.proto``.

``python -m anvil_gateway.grpc_stubs PROTO OUT_DIR`` (``make proto``) runs grpcio-tools' protoc (a dev
dependency) and writes ``grpc_service_pb2.py``, ``.pyi`` and ``grpc_service_pb2_grpc.py`` into
OUT_DIR. One change is made to protoc's output: the messages are built in a descriptor pool of their
own instead of protobuf's default one. Their names are the protocol's (``inference.ModelInferRequest``
...), the same as tritonclient's own copy, and the default pool refuses a second definition of a name:
with the default pool the gateway's module and ``tritonclient.grpc`` could not be imported into one
process (a test run). The wire is unaffected: only field numbers travel.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

__all__ = ["PACKAGE_PATH", "generate"]

PACKAGE_PATH = "anvil_gateway/proto_gen"  # where the modules live, as protoc names imports
_DEFAULT_POOL = "DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile("
_OWN_POOL = (
    "# A pool of its own: tritonclient defines the same names (anvil_gateway/grpc_stubs.py).\n"
    "DESCRIPTOR = _descriptor_pool.DescriptorPool().AddSerializedFile("
)


def generate(proto: Path, out_dir: Path) -> list[Path]:
    """Write the three generated files for ``proto`` into ``out_dir``; returns their paths."""
    from grpc_tools import protoc  # dev dependency (make proto, the staleness test)

    stem = proto.stem
    with tempfile.TemporaryDirectory() as tmp:
        args = [
            "protoc",
            f"-I{PACKAGE_PATH}={proto.parent}",  # so the _grpc module imports anvil_gateway.proto_gen...
            f"--python_out={tmp}",
            f"--pyi_out={tmp}",
            f"--grpc_python_out={tmp}",
            str(proto),
        ]
        if protoc.main(args) != 0:
            raise RuntimeError(f"protoc failed on {proto}")
        made = Path(tmp) / PACKAGE_PATH
        written = []
        for name in (f"{stem}_pb2.py", f"{stem}_pb2.pyi", f"{stem}_pb2_grpc.py"):
            text = (made / name).read_text()
            if name.endswith("_pb2.py"):
                if text.count(_DEFAULT_POOL) != 1:
                    raise RuntimeError(f"protoc's {name} no longer builds in the default pool once")
                text = text.replace(_DEFAULT_POOL, _OWN_POOL)
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / name).write_text(text)
            written.append(out_dir / name)
        shutil.rmtree(made, ignore_errors=True)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python -m anvil_gateway.grpc_stubs PROTO OUT_DIR")
    for path in generate(Path(sys.argv[1]), Path(sys.argv[2])):
        print(f"wrote {path}")
