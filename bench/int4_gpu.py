"""What INT4 weights buy on the GPU where weights dominate: a weight-bound model (4 linears of 8192 x 8192,
bias + ReLU between them, random weights from a fixed seed, built with onnx.helper: no torch) deployed
twice with `anvil deploy`, INT4 (W4A16 kernels, fp16 activations) and unquantized (fp16 weights on
cuBLAS), both as fp16 GPU plans (``--precision bf16``: both bf16, the dense model on bf16 weights: the
issue's "same model with bf16 weights"), then measured in the same run:

  1. in process (unless --skip-in-process): each compiled plan on cuda:0 (GpuPlanModel, CUDA graph
     replay), median ms per batch of 1 / 4 / 16 rows (32 / 64 too up to --max-batch: past 16 rows an
     sm_90 plan runs the measured tensor-core tiles), and the outputs' cosine to onnxruntime fp32;
  2. through the whole stack over HTTP (KServe v2, binary tensors in and out): closed loop of 1-row
     requests at concurrency 1 / 4 / 16 (the scheduler batches them: batch <= 16), requests/s and
     p50/p99 latency, INT4 / dense throughput ratio per concurrency (issue #16's target: >= 1.5x).

Deep model (issue #16: INT4 shows its kernel advantage once GPU time dominates the ~2.6 ms of host
time per request): ``--layers 256 --distinct 4`` cycles 256 linears over 4 distinct weight matrices
(ALBERT-style sharing, one ONNX initializer per matrix: the file stays under protobuf's 2 GiB, and
the compiler and executor store, quantize and upload each matrix once). 4+ matrices of 8192 x 8192
(fp16 128 MiB, INT4 ~34 MiB each) overflow the H200's 50 MB L2, so every linear still streams its
weights from HBM. ``--concurrency 1,4,16,64`` adds a level whose queue keeps the scheduler's batches
full (batch <= --max-batch 16).

Against a running stack whose executor has ANVIL_DEVICE=cuda:N (bench/h200_gpu.sh starts one):
    python bench/int4_gpu.py --out-dir bench/results      # writes int4_gpu.json and int4_gpu.md
    python bench/int4_gpu.py --layers 256 --distinct 4 --concurrency 1,4,16,64 --seconds 5
    python bench/int4_gpu.py --precision bf16                 # writes int4_gpu_bf16.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "services" / "compiler" / "tests"))
sys.path.insert(0, str(ROOT / "bench"))
import http_load  # noqa: E402

PRECISIONS = ("fp16", "bf16")
# batches timed in process, those up to --max-batch: past 16 rows an sm_90 plan runs the measured
# table's tensor-core tiles (8192 x 8192: up to 64 rows), other plans cuBLAS on dequantized weights
IN_PROCESS_BATCHES = (1, 4, 16, 32, 64)


def dense_name(precision: str) -> str:
    """The served name of the unquantized model (``wb_fp16`` / ``wb_bf16``)."""
    return f"wb_{precision}"


def variants(precision: str) -> dict[str, list[str]]:
    """Served name -> extra `anvil deploy` flags: the INT4 model first, then the dense one
    (``wb_fp16`` / ``wb_bf16``), both plans of ``precision``."""
    return {
        "wb_int4": ["--gpu-precision", precision, "--max-rel-error", "none"],
        dense_name(precision): ["--gpu-precision", precision, "--unquantized"],
    }


def _deploy(path: Path, name: str, extra: list[str], max_batch: int) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "anvil_client.cli", "deploy", str(path), "--name", name]
    cmd += ["--max-batch", str(max_batch), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-1500:], proc.stderr[-1500:], flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"deploy of {name} failed ({proc.returncode})")
    return time.perf_counter() - t0


def _wait_ready(client: httpx.Client, name: str, platform_: str, timeout_s: float = 300) -> float:
    t0 = time.perf_counter()
    r = None
    while time.perf_counter() - t0 < timeout_s:
        r = client.get(f"/v2/models/{name}")
        if r.status_code == 200 and platform_ in r.text:
            return time.perf_counter() - t0
        time.sleep(0.5)
    raise SystemExit(
        f"{name} not served as {platform_} after {timeout_s} s: {r and (r.status_code, r.text[:300])}"
    )


def _body(x: np.ndarray, inp: str = "x", out: str = "y") -> tuple[bytes, dict[str, str]]:
    """KServe v2 binary tensor request (input `inp`, output `out`): JSON header, then the raw fp32
    rows; the output comes back binary too (the JSON text of 8192 floats would cost more than the
    model)."""
    head = {
        "inputs": [
            {
                "name": inp,
                "datatype": "FP32",
                "shape": list(x.shape),
                "parameters": {"binary_data_size": x.nbytes},
            }
        ],
        "outputs": [{"name": out, "parameters": {"binary_data": True}}],
    }
    text = json.dumps(head, separators=(",", ":")).encode()
    headers = {"Inference-Header-Content-Length": str(len(text)), "Content-Type": "application/octet-stream"}
    return text + x.astype(np.float32).tobytes(), headers


def _parse(r: httpx.Response, dim: int) -> np.ndarray:
    n = int(r.headers.get("Inference-Header-Content-Length", "0"))
    if not n:
        out = r.json()["outputs"][0]
        return np.asarray(out["data"], np.float32).reshape(out["shape"])
    return np.frombuffer(r.content[n:], np.float32).reshape(-1, dim)


def closed_loop(
    url: str,
    name: str,
    x: np.ndarray,
    conc: int,
    seconds: float,
    inp: str = "x",
    out: str = "y",
    procs: int = 4,
) -> dict[str, Any]:
    """``conc`` closed-loop clients (bench/http_load.py, over ``min(procs, conc)`` processes) posting
    ``x`` to ``name`` for ``seconds``; each answer checked for ``x.shape[0]`` rows of the output, binary."""
    body, headers = _body(x, inp, out)
    job = http_load.Load(
        url=url,
        path=f"/v2/models/{name}/infer",
        bodies=(body,),
        headers=tuple(headers.items()),
        concurrency=conc,
        seconds=seconds,
        check="kserve_binary",
        expect=int(x.shape[0]) * _out_dim(x),
        procs=procs,
    )
    got = http_load.summary(http_load.run(job))
    row: dict[str, Any] = {
        "concurrency": conc,
        "client_processes": max(1, min(procs, conc)),
        "requests_per_s": got["items_per_s"],
        "p50_ms": got["p50_ms"],
        "p99_ms": got["p99_ms"],
        "ok": got["answers"],
        "errors": got["error_kinds"],
    }
    if "hops_p50_us" in got:
        row["hops_p50_us"] = got["hops_p50_us"]
    return row


def _out_dim(x: np.ndarray) -> int:
    """The served models answer rows as wide as their input (weight_bound: dim -> dim; identity)."""
    return int(np.prod(x.shape[1:]))


def _cos_min(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    c = (a64 * b64).sum(1) / (np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1))
    return round(float(c.min()), 6)


def _reference(onnx_path: Path, x: np.ndarray) -> np.ndarray | None:
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return np.asarray(sess.run(None, {"x": x})[0], np.float32)


def _reps(seconds_each: float, budget_s: float = 1.0, lo: int = 20, hi: int = 200) -> int:
    """Timed repetitions that fit ``budget_s`` (a 256-layer model takes ~10 ms a batch), within [lo, hi]."""
    return int(min(hi, max(lo, budget_s / max(seconds_each, 1e-6))))


def _linears(report: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """GpuPlanModel.linear_report folded: one entry per (backend, kernels by rows), with a count."""
    out: dict[str, dict[str, Any]] = {}
    for r in report:
        key = json.dumps([r["backend"], r["rows"]], sort_keys=True)
        out.setdefault(key, {"count": 0, "backend": r["backend"], "rows": r["rows"], "first": r["op"]})
        out[key]["count"] += 1
    return list(out.values())


def _in_process(
    onnx_path: Path, max_batch: int, x: np.ndarray, ref: np.ndarray | None, precision: str = "fp16"
) -> dict[str, Any]:
    """Both plans (``precision``) compiled here and run on cuda:0 by GpuPlanModel: per-batch time of the
    graph replay."""
    import cupy as cp

    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_model
    from anvil_executor.plan_runtime.gpu_model import GpuPlanModel

    arch = f"sm_{cp.cuda.Device(0).compute_capability}"
    out: dict[str, Any] = {}
    data = onnx_path.read_bytes()
    dense = dense_name(precision)
    for name, quantize in (("wb_int4", True), (dense, False)):
        art = Path(tempfile.mkdtemp(prefix=f"anvil_{name}_"))
        opts = CompileOptions(
            quantize=quantize, max_batch=max_batch, archs=(arch,), gpu_precision=precision, max_rel_error=None
        )
        t0 = time.perf_counter()
        compile_model("onnx", data, name, opts, art, name, build=True)
        compile_s = time.perf_counter() - t0
        model = GpuPlanModel.load(art, 0, name=name)
        row: dict[str, Any] = {"compile_s": round(compile_s, 1), "load_s": round(model.load_s, 2)}
        row["graphs"], row["graph_error"] = model.graph_count, model.graph_error
        row["linears"] = _linears(model.linear_report())
        row["weights_mib"] = round(model.weight_bytes / 2**20, 1)
        for b in IN_PROCESS_BATCHES:
            if b > max_batch:
                continue
            req = [{"x": x[:b]}]
            t1 = time.perf_counter()
            for _ in range(5):
                got = model.run(req)[0]["y"]
            reps = _reps((time.perf_counter() - t1) / 5)
            row[f"b{b}_ms"] = _run_ms(model, req, reps)
            row[f"b{b}_graph_us"] = _graph_us(model, b, reps)
            if ref is not None:
                row[f"b{b}_cos_min_vs_onnxruntime"] = _cos_min(got, ref[:b])
        if quantize:  # the same artifact, its W4A16 kernels launched as programmatic dependents (PDL)
            pdl = GpuPlanModel.load(art, 0, name=name, pdl=True)
            row["pdl_active"] = bool(pdl._lin16 is not None and pdl._lin16.pdl)
            for b in IN_PROCESS_BATCHES:
                if b > max_batch:
                    continue
                req = [{"x": x[:b]}]
                plain = model.run(req)[0]["y"]
                got = pdl.run(req)[0]["y"]
                row[f"b{b}_pdl_same_output"] = bool(np.array_equal(got, plain))
                reps = _reps(row[f"b{b}_ms"] / 1e3)
                row[f"b{b}_ms_pdl"] = _run_ms(pdl, req, reps)
                row[f"b{b}_graph_us_pdl"] = _graph_us(pdl, b, reps)
            del pdl
        out[name] = row
        del model
        cp.get_default_memory_pool().free_all_blocks()
    for b in IN_PROCESS_BATCHES:
        key, gkey = f"b{b}_ms", f"b{b}_graph_us"
        if key in out["wb_int4"] and key in out[dense]:
            out[f"speedup_b{b}"] = round(out[dense][key] / out["wb_int4"][key], 3)
        g4, g16 = out["wb_int4"].get(gkey), out[dense].get(gkey)
        if g4 and g16:
            out[f"graph_speedup_b{b}"] = round(g16 / g4, 3)
    return out


def _run_ms(model: Any, req: list[dict[str, np.ndarray]], reps: int) -> float:
    """Median ms of ``reps`` calls of ``model.run(req)`` (staging, graph launch, wait, fetch)."""
    times = []
    for _ in range(reps):
        t1 = time.perf_counter()
        model.run(req)
        times.append((time.perf_counter() - t1) * 1e3)
    return round(float(np.median(times)), 4)


def _graph_us(model: Any, b: int, reps: int = 200) -> float | None:
    """Median device time of one replay of the (b, 1) bucket's CUDA graph (CUDA events), µs: the GPU
    work alone, without the host's staging, launch and synchronize that ``run`` also pays."""
    import cupy as cp

    graph = model._graphs.get((b, 1))
    if graph is None:
        return None
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    with cp.cuda.Device(model.device_id), model.stream:
        for _ in range(reps):
            start.record(model.stream)
            graph.launch(model.stream)
            end.record(model.stream)
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end) * 1e3)
    return round(float(np.median(times)), 2)


def _gpu_name() -> str:
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        return res.stdout.strip().splitlines()[0] if res.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"


def _markdown(res: dict[str, Any]) -> str:
    m = res["model"]
    prec = res.get("precision", "fp16")
    dense = dense_name(prec)
    shared = (
        f", cycling over {m['distinct']} distinct weight matrices (shared, each stored and uploaded once)"
        if m.get("distinct")
        else ""
    )
    lines = [
        "# Weight-bound INT4 model on the GPU (`bench/int4_gpu.py`)",
        "",
        f"- Command: `{res['command']}`",
        f"- Commit: {res['commit']}; machine: {res['host']}, {res['gpu']}; date: {res['date']}",
        f"- Model: {m['layers']} linears of {m['dim']} x {m['dim']} (bias + ReLU){shared}, {prec} GPU "
        f"plans; INT4 = W4A16 g128, {prec} = the same weights unquantized",
        "",
    ]
    ip = res.get("in_process")
    if ip:
        lines += ["## In process (GpuPlanModel on cuda:0: `run` per batch, and the CUDA graph alone)", ""]
        lines += [
            f"| rows | INT4 run ms | {prec} run ms | {prec} / INT4 | INT4 graph µs | {prec} graph µs "
            f"| {prec} / INT4 graph |",
            "|---|---|---|---|---|---|---|",
        ]
        for b in IN_PROCESS_BATCHES:
            if f"b{b}_ms" in ip["wb_int4"]:
                i4, f16 = ip["wb_int4"], ip[dense]
                cells = [b, i4[f"b{b}_ms"], f16[f"b{b}_ms"], ip[f"speedup_b{b}"]]
                cells += [i4[f"b{b}_graph_us"], f16[f"b{b}_graph_us"], ip.get(f"graph_speedup_b{b}")]
                lines.append("| " + " | ".join(str(c) for c in cells) + " |")
        lines.append("")
        i4 = ip["wb_int4"]
        if "b1_graph_us_pdl" in i4:
            lines += [
                "INT4 plan with its W4A16 kernels launched as programmatic dependents (PDL, "
                f"`ANVIL_GPU_PDL`; active: {i4.get('pdl_active')}), same artifact, same run:",
                "",
                "| rows | INT4 run ms | INT4 + PDL run ms | INT4 graph µs | INT4 + PDL graph µs "
                "| graph plain / PDL | same output |",
                "|---|---|---|---|---|---|---|",
            ]
            for b in IN_PROCESS_BATCHES:
                if f"b{b}_graph_us_pdl" in i4:
                    g, gp = i4[f"b{b}_graph_us"], i4[f"b{b}_graph_us_pdl"]
                    ratio = round(g / gp, 3) if g and gp else None
                    cells = [b, i4[f"b{b}_ms"], i4[f"b{b}_ms_pdl"], g, gp, ratio, i4[f"b{b}_pdl_same_output"]]
                    lines.append("| " + " | ".join(str(c) for c in cells) + " |")
            lines.append("")
        for n in ("wb_int4", dense):
            r = ip[n]
            lines.append(
                f"- {n}: compile {r['compile_s']} s, load + capture {r['load_s']} s ({r['graphs']} graphs), "
                f"weights on the device {r['weights_mib']} MiB"
            )
        lines.append("")
    if res.get("http"):
        lines += ["## Whole stack over HTTP (KServe v2 binary tensors, 1-row requests, closed loop)", ""]
        lines += [
            f"| concurrency | INT4 req/s | p50 / p99 ms | {prec} req/s | p50 / p99 ms | INT4 / {prec} |",
            "|---|---|---|---|---|---|",
        ]
        for c, row in res["http"].items():
            i4, f16 = row["wb_int4"], row[dense]
            cells = [
                str(c),
                str(i4["requests_per_s"]),
                f"{i4['p50_ms']} / {i4['p99_ms']}",
                str(f16["requests_per_s"]),
                f"{f16['p50_ms']} / {f16['p99_ms']}",
                str(row["ratio"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        lines += [
            "",
            f"Target (issue #16): INT4 >= 1.5x {prec} at batch <= 16. Met: {res.get('target_met')}",
            "",
        ]
    if res.get("http_accuracy"):
        lines += [f"Served outputs, cosine min vs onnxruntime fp32: {res['http_accuracy']}", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--dim", type=int, default=8192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument(
        "--distinct",
        type=int,
        default=None,
        help="the layers cycle over this many weight matrices (default: every layer its own)",
    )
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=8.0, help="duration of each load phase, s")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--skip-in-process", action="store_true")
    ap.add_argument("--skip-http", action="store_true")
    ap.add_argument("--out-dir", default="bench/results")
    ap.add_argument("--platform", default="anvil_plan_cuda", help="wait until the models serve as this")
    ap.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="fp16",
        help="both plans' activations (and the dense weights)",
    )
    args = ap.parse_args()
    served = variants(args.precision)
    dense = dense_name(args.precision)
    from onnx_models import weight_bound_bytes

    matrices = args.layers if args.distinct is None else min(args.distinct, args.layers)
    if matrices * args.dim * args.dim * 4 >= 2**31:  # one protobuf; the compiler reads no external data
        ap.error(f"{matrices} fp32 matrices of {args.dim}^2 exceed ONNX's 2 GiB: use --distinct (<= 7 at 8k)")

    res: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "host": platform.node(),
        "gpu": _gpu_name(),
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "precision": args.precision,
        "model": {
            "dim": args.dim,
            "layers": args.layers,
            "distinct": args.distinct,
            "seed": 0,
            "max_batch": args.max_batch,
        },
    }
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    res["commit"] = os.environ.get("ANVIL_COMMIT") or git.stdout.strip() or "unknown"
    tmp = Path(tempfile.mkdtemp(prefix="anvil_int4_gpu_"))
    onnx_path = tmp / "weight_bound.onnx"
    t0 = time.perf_counter()
    onnx_path.write_bytes(weight_bound_bytes(args.dim, args.layers, seed=0, distinct=args.distinct))
    res["model"]["onnx_mib"] = round(onnx_path.stat().st_size / 2**20, 1)
    res["model"]["onnx_build_s"] = round(time.perf_counter() - t0, 1)
    print(f"model: {res['model']['onnx_mib']:.0f} MiB in {res['model']['onnx_build_s']} s", flush=True)
    rows = max(16, min(args.max_batch, max(IN_PROCESS_BATCHES)))
    x = np.random.default_rng(1).standard_normal((rows, args.dim)).astype(np.float32)
    t0 = time.perf_counter()
    ref = _reference(onnx_path, x)
    res["reference_s"] = round(time.perf_counter() - t0, 1)
    if not args.skip_in_process:
        t0 = time.perf_counter()
        res["in_process"] = _in_process(onnx_path, args.max_batch, x, ref, args.precision)
        res["in_process_s"] = round(time.perf_counter() - t0, 1)
        print(json.dumps(res["in_process"], indent=1), flush=True)
    if not args.skip_http:
        client = httpx.Client(base_url=args.url, timeout=60)
        res["deploy_s"] = {
            n: round(_deploy(onnx_path, n, extra, args.max_batch), 1) for n, extra in served.items()
        }
        res["ready_after_deploy_s"] = {n: round(_wait_ready(client, n, args.platform), 1) for n in served}
        acc: dict[str, float] = {}
        for n in served:
            body, headers = _body(x[:4])
            r = client.post(f"/v2/models/{n}/infer", content=body, headers=headers)
            if r.status_code != 200:
                raise SystemExit(f"{n}: HTTP {r.status_code}: {r.text[:300]}")
            if ref is not None:
                acc[n] = _cos_min(_parse(r, args.dim), ref[:4])
        res["http_accuracy"] = acc
        one = x[:1]
        http: dict[str, Any] = {}
        for c in (int(v) for v in args.concurrency.split(",")):
            for n in served:  # warm every batch bucket this concurrency reaches
                closed_loop(args.url, n, one, c, 1.0)
            row = {n: closed_loop(args.url, n, one, c, args.seconds) for n in served}
            row["ratio"] = round(
                row["wb_int4"]["requests_per_s"] / max(row[dense]["requests_per_s"], 1e-9), 3
            )
            http[str(c)] = row
            print(f"c{c}: {json.dumps(row)}", flush=True)
        res["http"] = http
        res["target_met"] = all(row["ratio"] >= 1.5 for row in http.values())
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem = "int4_gpu" if args.precision == "fp16" else f"int4_gpu_{args.precision}"
    (out / f"{stem}.json").write_text(json.dumps(res, indent=2) + "\n")
    (out / f"{stem}.md").write_text(_markdown(res))
    print(_markdown(res))


if __name__ == "__main__":
    main()
