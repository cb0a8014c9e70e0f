"""Compiled models served from the GPU through the whole stack (gateway -> scheduler -> GPU executor).

Against a running stack whose executor has ANVIL_DEVICE=cuda:N (`bench/h200_gpu.sh` starts one):
deploys a torch-exported MLP (fp32 and INT4) and a small BERT with `anvil deploy`, checks each answer
over KServe HTTP against onnxruntime on the same ONNX file, then measures the MLP at concurrency 1
(p50/p99, ms) and 16 (requests/s), and reads the executor's steady-state counters (device
allocations and module loads since load: both must stay 0) and its CUDA graph count.

    python bench/gpu_stack.py --url http://localhost:8000 --metrics http://localhost:8004/metrics \
        --out bench/results/gpu_stack.json
"""

from __future__ import annotations

import argparse
import asyncio
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


def _deploy(path: Path, name: str, extra: list[str]) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "anvil_client.cli", "deploy", str(path), "--name", name, *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    print(proc.stdout[-2000:], proc.stderr[-2000:], flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"deploy of {name} failed ({proc.returncode})")
    return time.perf_counter() - t0


def _wait_ready(client: httpx.Client, name: str, timeout_s: float = 180) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        r = client.get(f"/v2/models/{name}")
        if r.status_code == 200 and "anvil_plan_cuda" in r.text:
            return time.perf_counter() - t0
        time.sleep(0.5)
    raise SystemExit(f"{name} not served from the GPU after {timeout_s} s: {r.status_code} {r.text[:300]}")


def _infer(client: httpx.Client, name: str, feeds: dict[str, np.ndarray]) -> tuple[int, dict[str, Any]]:
    inputs = [
        {
            "name": k,
            "datatype": "FP32" if v.dtype == np.float32 else "INT64",
            "shape": list(v.shape),
            "data": v.reshape(-1).tolist(),
        }
        for k, v in feeds.items()
    ]
    r = client.post(f"/v2/models/{name}/infer", json={"inputs": inputs})
    return r.status_code, r.json()


def _check(client: httpx.Client, name: str, onnx_path: Path, feeds: list[dict[str, np.ndarray]]) -> float:
    """Largest relative error of the served answers against onnxruntime."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    worst = 0.0
    for f in feeds:
        code, body = _infer(client, name, f)
        if code != 200:
            raise SystemExit(f"{name}: HTTP {code}: {body}")
        out = body["outputs"][0]
        got = np.asarray(out["data"], np.float32).reshape(out["shape"])
        ref = sess.run(None, f)[0]
        worst = max(worst, float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-6)))
    return worst


async def _load(url: str, name: str, x: np.ndarray, conc: int, seconds: float) -> dict[str, float]:
    tensor = {"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.reshape(-1).tolist()}
    body = {"inputs": [tensor]}
    lat: list[float] = []
    errors = 0
    stop = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                r = await client.post(f"/v2/models/{name}/infer", json=body)
                if r.status_code == 200:
                    lat.append((time.perf_counter() - t0) * 1e3)
                else:
                    errors += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(conc)))
        wall = time.perf_counter() - t0
    a = np.asarray(lat)
    return {
        "concurrency": conc,
        "requests_per_s": round(len(lat) / wall, 1),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "errors": errors,
    }


def _metrics(url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in httpx.get(url, timeout=5).text.splitlines():
        if line.startswith(
            (
                "anvil_executor_device_allocations_steady",
                "anvil_executor_module_loads_steady",
                "anvil_executor_cuda_graphs",
                "anvil_executor_padding_waste_ratio",
            )
        ):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--metrics", default="http://localhost:8004/metrics")
    ap.add_argument("--seconds", type=float, default=5.0, help="duration of each load phase, s")
    ap.add_argument("--out", default="bench/results/gpu_stack.json")
    args = ap.parse_args()
    from torch_models import export_bert, export_mlp

    tmp = Path(tempfile.mkdtemp(prefix="anvil_gpu_stack_"))
    mlp, bert = export_mlp(tmp / "mlp.onnx"), export_bert(tmp / "bert.onnx")
    res: dict[str, Any] = {"command": " ".join(sys.argv), "host": platform.node()}
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    res["commit"] = os.environ.get("ANVIL_COMMIT") or git.stdout.strip()  # the device copy has no .git
    client = httpx.Client(base_url=args.url, timeout=30)
    deploy_s = {
        "gmlp": _deploy(mlp, "gmlp", ["--unquantized"]),
        "gmlp4": _deploy(mlp, "gmlp4", []),
        "gbert": _deploy(bert, "gbert", ["--unquantized", "--max-seq", "64"]),
    }
    res["deploy_s"] = {k: round(v, 2) for k, v in deploy_s.items()}
    res["ready_after_deploy_s"] = {n: round(_wait_ready(client, n), 2) for n in deploy_s}
    rng = np.random.default_rng(0)
    mlp_feeds = [{"x": rng.standard_normal((n, 64)).astype(np.float32)} for n in (1, 3, 8)]
    bert_feeds = [
        {
            "input_ids": rng.integers(0, 500, (1, n)).astype(np.int64),
            "attention_mask": np.ones((1, n), np.int64),
        }
        for n in (5, 17, 40)
    ]
    res["max_rel_error_vs_onnxruntime"] = {
        "gmlp": _check(client, "gmlp", mlp, mlp_feeds),
        "gmlp4": _check(client, "gmlp4", mlp, mlp_feeds),
        "gbert": _check(client, "gbert", bert, bert_feeds),
    }
    x = rng.standard_normal((1, 64)).astype(np.float32)
    res["gmlp_c1"] = asyncio.run(_load(args.url, "gmlp", x, 1, args.seconds))
    res["gmlp_c16"] = asyncio.run(_load(args.url, "gmlp", x, 16, args.seconds))
    res["executor_metrics"] = _metrics(args.metrics)
    print(json.dumps(res, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=2) + "\n")


if __name__ == "__main__":
    main()
