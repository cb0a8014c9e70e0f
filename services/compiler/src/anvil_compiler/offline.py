"""`python -m anvil_compiler.offline`: compile an HF directory or an ONNX file into a
content-addressed artifact directory, without the HTTP service (the executor runs it for its compiled
built-ins: `minilm` from its HF directory; on a GPU, `mlp` and `mlp4x1024` from ONNX files it writes).

    python -m anvil_compiler.offline (--hf DIR | --onnx FILE) --out-root ROOT --name NAME
        [--options JSON] [--no-build]

The artifact id is the compiler's own content address (``artifact_key``: model bytes, format,
options, compiler version), the one `anvil deploy` of the same directory and options gets; when
``ROOT/{id}/manifest.json`` exists nothing is compiled. stdout carries one JSON object a line:
``{"stage": ..., "percent": ...}`` while compiling, then ``{"artifact": id, "path": ..., "cached":
bool, "compile_s": ...}``. A failure exits 1 with ``{"error": ...}`` as its last line.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from anvil_compiler.artifacts import artifact_key, model_digest, read_manifest
from anvil_compiler.errors import CompileError
from anvil_compiler.frontends.hf import bundle_from_dir
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model

__all__ = ["compile_bytes", "compile_dir", "main"]


def _say(doc: dict[str, object]) -> None:
    print(json.dumps(doc), flush=True)


def compile_dir(
    hf_dir: Path, out_root: Path, name: str, opts: CompileOptions, build: bool
) -> dict[str, object]:
    """Compile (or find) the artifact of ``hf_dir``; returns the final status line's fields."""
    return compile_bytes("hf", bundle_from_dir(hf_dir), out_root, name, opts, build)


def compile_bytes(
    fmt: str, data: bytes, out_root: Path, name: str, opts: CompileOptions, build: bool
) -> dict[str, object]:
    """Compile (or find) the artifact of ``data`` in format ``fmt`` (``hf`` bundle or ``onnx``)."""
    key = artifact_key(model_digest(data), fmt, opts)
    final = out_root / key
    if read_manifest(final) is not None:
        return {"artifact": key, "path": str(final), "cached": True, "compile_s": 0.0}
    t0 = time.perf_counter()
    tmp = out_root / f".{key}.{os.getpid()}.tmp"  # renamed into place whole: no half artifact is seen
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        compile_model(
            fmt,
            data,
            name,
            opts,
            tmp,
            key,
            progress=lambda s, p: _say({"stage": s, "percent": p}),
            build=build,
        )
        try:
            tmp.rename(final)
        except OSError:  # another process finished the same key first: its copy is as good
            if read_manifest(final) is None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "artifact": key,
        "path": str(final),
        "cached": False,
        "compile_s": round(time.perf_counter() - t0, 3),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hf", type=Path, help="HF directory: config.json + model.safetensors")
    src.add_argument("--onnx", type=Path, help="ONNX model file")
    ap.add_argument("--out-root", type=Path, required=True, help="artifact directory root")
    ap.add_argument("--name", required=True)
    ap.add_argument("--options", default="{}", help="CompileOptions fields as JSON")
    ap.add_argument("--no-build", action="store_true", help="no CUDA kernels (a CPU executor needs none)")
    args = ap.parse_args(argv)
    try:
        opts = CompileOptions.from_dict(json.loads(args.options))
        args.out_root.mkdir(parents=True, exist_ok=True)
        build = not args.no_build
        if args.hf is not None:
            _say(compile_dir(args.hf, args.out_root, args.name, opts, build))
        else:
            data = args.onnx.read_bytes()
            _say(compile_bytes("onnx", data, args.out_root, args.name, opts, build))
    except (CompileError, OSError, ValueError) as exc:
        _say({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
