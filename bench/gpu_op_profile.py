"""Where a compiled encoder's GPU time goes, and what the serving path around it costs.

One command on a GPU host (no stack needed):

    python bench/gpu_op_profile.py --model-dir DIR --out bench/results/gpu_op_profile.json

For an HF sentence encoder (e.g. all-MiniLM-L6-v2) compiled unquantized, as an fp16 plan (fp16
activations, cuBLAS fp16 + fp16 epilogues) and as an fp32 plan (cuBLAS TF32 + the fp32 epilogue), per
(batch, tokens) shape:
  - one CUDA-graph replay of the whole plan (median of 30, µs) and the rate it implies (sequences/s):
    events around one launch, so it includes the host's graph launch (what a lone batch meets, and it
    differs between hosts); and back-to-back (`graph_steady_us`): STEADY launches between two events,
    per launch, the device's own time for the graph (what compares kernels across hosts);
  - each launch timed alone (eager, CUDA events), summed per kernel kind (µs and share of the sum);
  - the same for each variant of --variants (fp16, fp16-lt: QKV's bias inside cuBLASLt, bf16,
    bf16-lt: the bf16 plan, fp32, fp32-per-row: the previous attention kernel, one block per query
    row) for an A/B in one run.
Then the costs of the path around the GPU on this host: the fast tokenizer (one string at a time and
a batch encode, sentences/s) and the /v1/embeddings body encoding of 32 x 384 floats (µs).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus import sentences  # noqa: E402

# plan precision [-lt: cuBLASLt bias epilogues] [-per-row: the per-row attention kernel]
VARIANTS = ("fp16", "fp16-lt", "bf16", "bf16-lt", "fp32", "fp32-per-row")


def compile_variant(
    model_dir: Path, out: Path, staged: bool, max_batch: int, max_seq: int, arch: str, precision: str
) -> Path:
    from anvil_client.deploy import hf_bundle
    from anvil_compiler.codegen import kernels
    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_model

    saved = kernels.ATTENTION_SMEM_MAX_BYTES
    kernels.ATTENTION_SMEM_MAX_BYTES = saved if staged else 0  # 0: every attention takes the per-row kernel
    try:
        opts = CompileOptions(
            quantize=False, max_batch=max_batch, max_seq=max_seq, archs=(arch,), gpu_precision=precision
        )
        compile_model("hf", hf_bundle(model_dir), "minilm", opts, out, key=f"{precision}-{staged}")
    finally:
        kernels.ATTENTION_SMEM_MAX_BYTES = saved
    return out


def kind_of(kernel: str) -> str:
    """anvil_<kind>_<digest> -> kind."""
    return kernel.removeprefix("anvil_").rsplit("_", 1)[0]


def fill_inputs(model: Any, b: int, t: int, rng: np.random.Generator) -> None:
    for name, _, _, _ in model.inputs:
        dst = model._pinned(name, b, t)
        if "mask" in name:
            dst[...] = 1
        elif "ids" in name and "type" not in name:
            dst[...] = rng.integers(1000, 20000, size=dst.shape)
        else:
            dst[...] = 0


def kernel_times(model: Any, graph: Any, reps: int) -> dict[str, float]:
    """µs per graph replay by kernel kind, from CUPTI through torch.profiler (graph kernel nodes are
    recorded one by one); {} where torch is absent."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        return {}
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            graph.launch(model.stream)
        model.stream.synchronize()
    per_kind: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        name = ev.key
        kind = (
            kind_of(name)
            if name.startswith("anvil_")
            else (
                "cublas_gemm"
                if "gemm" in name.lower() or "sm90" in name or "cutlass" in name.lower()
                else name[:40]
            )
        )
        per_kind[kind] += (
            float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0)) / reps
        )
    return per_kind


STEADY = 10  # graph launches between the events of one back-to-back measurement


def profile_shape(model: Any, b: int, t: int, reps: int) -> dict[str, Any]:
    import cupy as cp

    fill_inputs(model, b, t, np.random.default_rng(b * 1000 + t))
    graph = model._graphs[(b, t)]  # captured at load, as the executor serves it
    with cp.cuda.Device(model.device_id), model.stream:
        start, end = cp.cuda.Event(), cp.cuda.Event()
        graph.launch(model.stream)
        model.stream.synchronize()
        replay = []
        for _ in range(reps):
            start.record(model.stream)
            graph.launch(model.stream)
            end.record(model.stream)
            end.synchronize()
            replay.append(cp.cuda.get_elapsed_time(start, end) * 1e3)  # µs
        steady = []
        for _ in range(max(3, reps // STEADY)):
            graph.launch(model.stream)  # the device is busy when `start` is recorded
            start.record(model.stream)
            for _ in range(STEADY):
                graph.launch(model.stream)
            end.record(model.stream)
            end.synchronize()
            steady.append(cp.cuda.get_elapsed_time(start, end) * 1e3 / STEADY)
    try:
        per_kind = kernel_times(model, graph, reps)
    except Exception as exc:  # the breakdown is optional; the replay times stand
        print(f"kernel breakdown failed: {exc}", flush=True)
        per_kind = {}
    total = sum(per_kind.values())
    ranked = sorted(per_kind.items(), key=lambda kv: -kv[1])
    med = statistics.median(replay)
    return {
        "batch": b,
        "tokens": t,
        "graph_replay_us": round(med, 1),
        "graph_steady_us": round(statistics.median(steady), 1),
        "sequences_per_s": round(b / med * 1e6),
        "kernel_sum_us": round(total, 1),
        "per_kind_us": {k: round(v, 1) for k, v in ranked},
        "per_kind_share": {k: round(v / total, 3) for k, v in ranked} if total else {},
    }


def tokenizer_rates(model_dir: Path, texts: list[str]) -> dict[str, Any]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_truncation(max_length=128)
    tok.no_padding()
    out: dict[str, Any] = {"cpu_count": os.cpu_count()}
    t0 = time.perf_counter()
    for s in texts:
        tok.encode(s)
    out["one_at_a_time_per_s"] = round(len(texts) / (time.perf_counter() - t0))
    for batch in (32, 512):
        n, t0 = 0, time.perf_counter()
        while n < len(texts):
            tok.encode_batch(texts[n : n + batch])
            n += batch
        out[f"encode_batch_{batch}_per_s"] = round(n / (time.perf_counter() - t0))
    return out


def embeddings_json_cost() -> dict[str, Any]:
    from anvil_gateway import json_codec
    from anvil_gateway.embeddings import encode_embeddings

    vecs = np.random.default_rng(0).standard_normal((32, 384)).astype(np.float32)
    out: dict[str, Any] = {}
    for label, fn in (
        ("float32_shortest", lambda: encode_embeddings(vecs, "float", "m", 1000)),
        (
            "float64_tolist_spelling",
            lambda: json_codec.dumps({"data": [{"embedding": v} for v in vecs], "model": "m"}),
        ),
    ):
        fn()
        times = []
        for _ in range(200):
            t0 = time.perf_counter()
            body = fn()
            times.append((time.perf_counter() - t0) * 1e6)
        out[label] = {"us": round(statistics.median(times), 1), "bytes": len(body)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/gpu_op_profile.json")
    ap.add_argument("--max-batch", type=int, default=512)
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument("--shapes", default="1x16,32x48,128x48,512x48,512x64")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument(
        "--variants",
        default="fp16,fp16-lt,fp32",
        help=", ".join(VARIANTS) + " (-lt: cuBLASLt bias epilogues; -per-row: the per-row attention)",
    )
    args = ap.parse_args()
    import cupy as cp
    from safetensors.numpy import load_file

    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel, load_module
    from anvil_executor.plan_runtime.plan import load_plan

    arch = f"sm_{cp.cuda.Device(0).compute_capability}"
    gpu_name = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    res: dict[str, Any] = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "commit": os.environ.get("ANVIL_COMMIT") or _git_commit(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {gpu_name}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "plan": {"max_batch": args.max_batch, "max_seq": args.max_seq, "weights": "unquantized"},
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        for label in args.variants.split(","):
            if label not in VARIANTS:
                raise SystemExit(f"unknown variant {label!r}: {', '.join(VARIANTS)}")
            precision, staged = label.split("-")[0], not label.endswith("per-row")
            d = Path(tmp) / label
            compile_variant(args.model_dir, d, staged, args.max_batch, args.max_seq, arch, precision)
            plan, weights = load_plan(d / "plan.bin"), load_file(str(d / "weights.safetensors"))
            model = GpuPlanModel(
                plan, weights, load_module(d, 0), 0, "minilm", lt_epilogue=label.endswith("-lt")
            )
            missing = [(b, t) for b, t in shapes if (b, t) not in model._graphs]
            if missing:
                raise SystemExit(f"shapes {missing} are not capture buckets; buckets: {model.buckets}")
            rows = [profile_shape(model, b, t, args.reps) for b, t in shapes]
            res["variants"][label] = rows
            print(f"== {label}")
            for r in rows:
                top = ", ".join(f"{k} {v:.0%}" for k, v in list(r["per_kind_share"].items())[:4])
                head = f"  B={r['batch']:4d} T={r['tokens']:3d}: graph {r['graph_replay_us']:9.1f} us"
                head += f" (back-to-back {r['graph_steady_us']:.1f} us)"
                rate = f"({r['sequences_per_s']:,} seq/s); kernels {r['kernel_sum_us']:.0f} us"
                print(f"{head} {rate}: {top}", flush=True)
            del model
    texts = sentences(2048)
    res["tokenizer"] = tokenizer_rates(args.model_dir, texts)
    print("tokenizer:", res["tokenizer"], flush=True)
    try:
        res["embeddings_json_32x384"] = embeddings_json_cost()
        print("embeddings JSON:", res["embeddings_json_32x384"], flush=True)
    except ImportError as exc:  # the gateway's deps (fastapi) absent on this host
        res["embeddings_json_32x384"] = f"not measured: {exc}"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {args.out}")


def _git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
