"""all-MiniLM-L6-v2 served from the GPU through the whole stack (/v1/embeddings, OpenAI format) vs
sentence-transformers in process, same corpus (bench/corpus.py), same run.

Against a running stack whose executor has ANVIL_DEVICE=cuda:N (bench/h200_gpu.sh starts one), it
deploys the checkpoint directory with `anvil deploy` (the artifact keeps the tokenizer, so the plan
serves text), checks accuracy against sentence-transformers fp32 on the GPU, then measures:
  - requests of 32 sentences, closed loop, concurrency 16 and 64: sentences/s, p50/p99 (ms);
  - single sentences, concurrency 1: p50/p99 (ms);
  - sentence-transformers in process: fp32 and fp16 at batch 32, 128, 512; the best is the reference;
  - infinity-emb (its own OpenAI-compatible server, torch engine, fp16, started here on --infinity-port
    with the same checkpoint) under the same client load as Anvil; skipped with the reason recorded
    when `infinity_emb` is not importable or its server does not come up.

    python bench/minilm_gpu.py --model-dir DIR --out-dir bench/results
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import http_load  # noqa: E402
from corpus import CORPUS, sentences  # noqa: E402
from minilm_hops import c1_hops  # noqa: E402

from anvil_client.gpus import executors_per_gpu  # noqa: E402

# The INT4 accuracy preset of docs/compiler.md ("INT4 accuracy"): RTN g32 with clip search, layers 2-5
# fp32 (8 of 24 linears INT4), no error budget keeping more layers fp32 (test_hf_minilm.py asserts it
# on the CPU); on a GPU its g32 linears run cuBLAS on weights dequantized at load
INT4_PRESET = ("--group", "32", "--clip-search", "--keep-fp32", "encoder.layer.[2-5].*")
INT4_PRESET += ("--max-rel-error", "none")


def deploy(
    model_dir: Path,
    name: str,
    max_batch: int,
    max_seq: int,
    precision: str,
    weights: tuple[str, ...] = ("--unquantized",),
) -> float:
    t0 = time.perf_counter()
    cmd = [sys.executable, "-m", "anvil_client.cli", "deploy", str(model_dir), "--name", name, *weights]
    cmd += ["--max-batch", str(max_batch), "--max-seq", str(max_seq), "--gpu-precision", precision]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    print(proc.stdout[-1500:], proc.stderr[-1500:], flush=True)
    if proc.returncode != 0:
        raise SystemExit(f"deploy of {name} failed ({proc.returncode})")
    return time.perf_counter() - t0


def wait_text_model(url: str, name: str, timeout_s: float = 300) -> float:
    t0 = time.perf_counter()
    with httpx.Client(base_url=url, timeout=10) as c:
        while time.perf_counter() - t0 < timeout_s:
            r = c.get(f"/v2/models/{name}")
            text = r.status_code == 200 and r.json().get("platform") == "anvil_text_embedding"
            if text and c.get(f"/v2/models/{name}/ready").status_code == 200:
                return time.perf_counter() - t0
            time.sleep(0.5)
    raise SystemExit(f"{name} not served as text after {timeout_s} s")


async def embed_all(url: str, name: str, texts: list[str], batch: int = 32) -> np.ndarray:
    out: list[list[float]] = []
    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        for i in range(0, len(texts), batch):
            r = await c.post("/v1/embeddings", json={"model": name, "input": texts[i : i + batch]})
            if r.status_code != 200:
                raise SystemExit(f"/v1/embeddings: HTTP {r.status_code}: {r.text[:300]}")
            out += [d["embedding"] for d in r.json()["data"]]
    return np.asarray(out, np.float32)


CLIENT_PROCS = 4  # load-generator processes (bench/http_load.py: one thread per client in them)
ENCODING = "base64"  # what the OpenAI Python client asks for when the caller names no format


def bodies(name: str, texts: list[str], per_req: int, fmt: str = ENCODING) -> tuple[bytes, ...]:
    """/v1/embeddings bodies of ``per_req`` consecutive corpus sentences each, the corpus covered."""
    out = []
    for i in range(0, max(len(texts) - per_req + 1, 1), per_req):
        chunk = texts[i : i + per_req]
        doc = {"model": name, "input": chunk if per_req > 1 else chunk[0], "encoding_format": fmt}
        out.append(json.dumps(doc).encode())
    return tuple(out)


def load(
    url: str,
    name: str,
    texts: list[str],
    per_req: int,
    conc: int,
    seconds: float,
    who: str = "anvil",
    procs: int = CLIENT_PROCS,
    fmt: str = ENCODING,
    warmup: float = 0.0,
) -> dict[str, Any]:
    """``conc`` closed-loop clients (bench/http_load.py) over ``min(procs, conc)`` processes, for
    ``seconds``; every answer decoded as the OpenAI client does and checked for ``per_req`` vectors.
    ``warmup``: seconds of the same load first, not counted (every server's first batches of a shape
    and size, e.g. a peer's lazily loaded kernels, fall there)."""
    job = http_load.Load(
        url=url,
        path="/v1/embeddings",
        bodies=bodies(name, texts, per_req, fmt),
        headers=(("Content-Type", "application/json"),),
        concurrency=conc,
        seconds=seconds,
        check="embeddings",
        expect=per_req,
        procs=procs,
    )
    if warmup > 0:
        http_load.run(dataclasses.replace(job, seconds=warmup))
    got = http_load.summary(http_load.run(job), per_req)
    row: dict[str, Any] = {
        "what": f"{who} {per_req} sentences/request",
        "concurrency": conc,
        "client_processes": max(1, min(procs, conc)),
        "encoding_format": fmt,
        "sentences_per_s": got["items_per_s"],
        "p50_ms": round(got["p50_ms"], 2),
        "p99_ms": round(got["p99_ms"], 2),
        "errors": got["errors"],
        "error_statuses": got["error_kinds"],  # HTTP status (or "bad answer", a socket error): count
    }
    if "hops_p50_us" in got:
        row["hops_p50_us"] = got["hops_p50_us"]
    return row


def st_speed(st: Any, texts: list[str], batch: int, seconds: float, label: str) -> dict[str, Any]:
    st.encode(texts[:batch], batch_size=batch)  # warm-up
    lat, n, i = [], 0, 0
    t_start = time.perf_counter()
    while time.perf_counter() - t_start < seconds:
        chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
        t0 = time.perf_counter()
        st.encode(chunk, batch_size=batch)
        lat.append((time.perf_counter() - t0) * 1e3)
        n += batch
        i += batch
    return {
        "what": f"sentence-transformers {label} b{batch}",
        "sentences_per_s": round(n / (time.perf_counter() - t_start), 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
    }


def start_infinity(model_dir: Path, port: int, batch: int, timeout_s: float = 240) -> subprocess.Popen[bytes]:
    """infinity-emb's server on ``port`` (OpenAI routes under /v1), torch engine, fp16; returns once
    its model answers, or raises RuntimeError with the tail of its log."""
    cmd = [sys.executable, str(ROOT / "bench/peers/infinity_server.py"), "v2", "--model-id", str(model_dir)]
    cmd += ["--served-model-name", "infinity-minilm", "--engine", "torch", "--dtype", "float16"]
    cmd += ["--batch-size", str(batch), "--port", str(port), "--url-prefix", "/v1", "--host", "127.0.0.1"]
    env = {**os.environ, "INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1"}
    log = open(f"/tmp/infinity-{port}.log", "wb")  # noqa: SIM115 (the server outlives this function)
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout_s:
        if proc.poll() is not None:
            break
        try:
            r = httpx.post(
                f"http://127.0.0.1:{port}/v1/embeddings",
                json={"model": "infinity-minilm", "input": ["warm up"]},
                timeout=5,
            )
            if r.status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(1)
    proc.kill()
    tail = Path(f"/tmp/infinity-{port}.log").read_bytes()[-1500:].decode(errors="replace")
    raise RuntimeError(f"infinity-emb did not serve (exit {proc.poll()}): {tail}")


def _hops_cell(row: dict[str, Any]) -> str:
    h = row.get("hops_p50_us")
    if not h:
        return ""
    cell = " / ".join(str(h[k]) for k in ("in", "queue", "compute", "transit"))
    parts = ("to_scheduler", "to_executor", "executor_queue", "back")
    if all(k in h for k in parts):  # transit's split (the services' stamps)
        cell += " (" + " / ".join(str(h[k]) for k in parts) + ")"
    return cell


def accuracy(got: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    nn = lambda e: np.argsort(-(e @ e.T) + 2 * np.eye(len(e)), axis=1)[:, 0]  # noqa: E731
    return {
        "mean_cosine": round(float(cos.mean()), 6),
        "min_cosine": round(float(cos.min()), 6),
        "nn_agreement": round(float((nn(got) == nn(ref)).mean()), 4),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--model-dir", type=Path, required=True, help="HF checkpoint dir (with tokenizer.json)")
    ap.add_argument("--name", default="minilm-gpu")
    ap.add_argument("--max-batch", type=int, default=512, help="plan rows per GPU run")
    ap.add_argument("--max-seq", type=int, default=128)
    ap.add_argument(
        "--gpu-precision",
        choices=("fp16", "bf16", "fp32"),
        default="fp16",
        help="the plan's activations on the GPU",
    )
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=6.0, help="duration of each load phase, s")
    ap.add_argument(
        "--warmup-seconds",
        type=float,
        default=2.0,
        help="the same load before each measured phase, not counted, for every server, s",
    )
    ap.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--infinity-port", type=int, default=7997)
    ap.add_argument(
        "--no-peers",
        action="store_true",
        help="no peers next to the stack: a quick A/B of settings (no ratios, but those to the "
        "peers measured alone where --peers-alone is given)",
    )
    ap.add_argument("--infinity-batch", type=int, default=128, help="infinity-emb's --batch-size")
    ap.add_argument(
        "--peers-only",
        action="store_true",
        help="only the peers (infinity-emb, sentence-transformers), no Anvil stack needed: run it before "
        "the stack starts, in the same call, and hand its JSON to --peers-alone",
    )
    ap.add_argument(
        "--peers-alone",
        type=Path,
        default=None,
        help="a --peers-only JSON of this call: its figures (the peers with the GPU and cores to "
        "themselves) are reported and ratioed beside those measured next to the running stack",
    )
    ap.add_argument(
        "--encoding-format",
        choices=("base64", "float"),
        default=ENCODING,
        help="what every load client asks for (base64: the OpenAI Python client's default)",
    )
    ap.add_argument("--client-procs", type=int, default=CLIENT_PROCS, help="load-generator processes")
    ap.add_argument(
        "--int4-preset",
        action="store_true",
        help="also deploy the INT4 accuracy preset (as <name>-int4) and report its accuracy through "
        "the stack against sentence-transformers fp32 (issue #16: mean >= 0.995, min >= 0.98)",
    )
    args = ap.parse_args()
    import torch
    from sentence_transformers import SentenceTransformer

    texts = sentences(args.sentences)
    res: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "commit": os.environ.get("ANVIL_COMMIT", ""),
        "host": platform.node(),
        "gpu": torch.cuda.get_device_name(0),
        "corpus": CORPUS,
        "sentences": len(texts),
        "plan": {
            "max_batch": args.max_batch,
            "max_seq": args.max_seq,
            "weights": "fp32 checkpoint, unquantized; fp16 on the device in an fp16 plan",
            "gpu_precision": args.gpu_precision,
            "gemm": os.environ.get("ANVIL_GPU_GEMM", "cublas"),
        },
        "gateway_workers": int(os.environ.get("ANVIL_HTTP_WORKERS", "1")),
        # what `anvil up` started (the launcher's count for this host when the variable is unset)
        "executors_per_gpu": executors_per_gpu(os.environ.get("ANVIL_EXECUTORS_PER_GPU")),
    }
    client = {"procs": args.client_procs, "fmt": args.encoding_format, "warmup": args.warmup_seconds}
    res["client"] = {
        "generator": "bench/http_load.py: one keep-alive http_load.Wire connection per concurrent client",
        "processes": args.client_procs,
        "encoding_format": args.encoding_format,
        "warmup_s": args.warmup_seconds,
    }
    if args.peers_only:  # the peers with the GPU and the cores to themselves
        peers = run_peers(args, texts, client)
        res |= {"peers_alone": True, **peers}
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "minilm_peers_alone.json").write_text(json.dumps(res, indent=2) + "\n")
        print(json.dumps(res, indent=2))
        return
    res["deploy_s"] = round(
        deploy(args.model_dir, args.name, args.max_batch, args.max_seq, args.gpu_precision), 2
    )
    res["ready_after_deploy_s"] = round(wait_text_model(args.url, args.name), 2)
    # .float(): transformers 5 loads a checkpoint in its stored dtype ("auto"), fp16 for the carried one
    st = SentenceTransformer(str(args.model_dir), device="cuda").float()
    ref = st.encode(texts, batch_size=128, convert_to_numpy=True, normalize_embeddings=True).astype(
        np.float32
    )
    got = asyncio.run(embed_all(args.url, args.name, texts))
    res["accuracy_vs_st_fp32"] = accuracy(got, ref)
    if args.int4_preset:  # the INT4 preset, same corpus and reference, through the stack
        name4 = f"{args.name}-int4"
        dep = deploy(args.model_dir, name4, args.max_batch, args.max_seq, args.gpu_precision, INT4_PRESET)
        ready = wait_text_model(args.url, name4)
        res["int4_preset"] = {
            "name": name4,
            "deploy_options": " ".join(INT4_PRESET),
            "deploy_s": round(dep, 2),
            "ready_after_deploy_s": round(ready, 2),
            "accuracy_vs_st_fp32": accuracy(asyncio.run(embed_all(args.url, name4, texts)), ref),
        }
        print("INT4 preset:", res["int4_preset"], flush=True)
    del st  # the peers load their own
    rows = [
        load(args.url, args.name, texts, 32, 16, args.seconds, **client),
        load(args.url, args.name, texts, 32, 64, args.seconds, **client),
        load(args.url, args.name, texts, 1, 1, args.seconds, **client),
    ]
    if args.encoding_format == "base64":  # the float JSON answers of earlier runs, for comparison
        rows.append(load(args.url, args.name, texts, 32, 16, args.seconds, **(client | {"fmt": "float"})))
    res["c1_hops"] = c1_hops(args.url, args.name, texts, split_compute=res["gateway_workers"] == 1)
    print("c1 hops (KServe BYTES, one sentence):", res["c1_hops"], flush=True)
    inf_rows: list[dict[str, Any]] = []
    if args.no_peers:
        res["infinity"] = res["sentence_transformers"] = "not run next to the stack (--no-peers)"
        res["anvil"] = rows
        if args.peers_alone is not None and args.peers_alone.is_file():  # measured alone, same call
            res["peers_alone"] = alone_summary(
                json.loads(args.peers_alone.read_text()), rows[0]["sentences_per_s"]
            )
        print(json.dumps(res, indent=2))
        print(
            "\n".join(
                f"{r['what']} c{r['concurrency']} {r['encoding_format']}: {r['sentences_per_s']:,} sent/s, "
                f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, errors {r['errors']}, hops {_hops_cell(r)}"
                for r in rows
            )
        )
        write(args.out_dir, res, rows, [], [], None, len(texts))
        return
    peers = run_peers(args, texts, client)
    inf_rows = peers["infinity"] if isinstance(peers["infinity"], list) else []
    st_rows, best = peers["sentence_transformers"], peers["st_best_row"]
    res["infinity"], res["infinity_log_tail"] = peers["infinity"], peers["infinity_log_tail"]
    if inf_rows:
        res["ratio_c16_vs_infinity"] = round(rows[0]["sentences_per_s"] / inf_rows[0]["sentences_per_s"], 3)
    res["anvil"], res["sentence_transformers"], res["st_best"] = rows, st_rows, best["what"]
    res["ratio_c16_vs_st_best"] = round(rows[0]["sentences_per_s"] / best["sentences_per_s"], 3)
    if args.peers_alone is not None and args.peers_alone.is_file():
        alone = json.loads(args.peers_alone.read_text())
        res["peers_alone"] = alone_summary(alone, rows[0]["sentences_per_s"])
    print(json.dumps(res, indent=2))
    write(args.out_dir, res, rows, inf_rows, st_rows, best, len(texts))


def run_peers(args: argparse.Namespace, texts: list[str], client: dict[str, Any]) -> dict[str, Any]:
    """infinity-emb under the same client load as Anvil (32 sentences at c16 and c64, one at c1), then
    sentence-transformers in process (fp32 and fp16 at batch 32, 128, 512); the best of the latter is
    the reference. infinity's rows, or why it was not measured, and the tail of its log."""
    from sentence_transformers import SentenceTransformer

    out: dict[str, Any] = {}
    inf_rows: list[dict[str, Any]] = []
    try:
        proc = start_infinity(args.model_dir, args.infinity_port, args.infinity_batch)
        try:
            inf_url = f"http://127.0.0.1:{args.infinity_port}"
            for per_req, conc in ((32, 16), (32, 64), (1, 1)):
                inf_rows.append(
                    load(
                        inf_url,
                        "infinity-minilm",
                        texts,
                        per_req,
                        conc,
                        args.seconds,
                        "infinity-emb",
                        **client,
                    )
                )
        finally:
            proc.terminate()
            proc.wait(30)
        out["infinity"] = inf_rows
    except (RuntimeError, OSError) as exc:
        out["infinity"] = f"not measured: {exc}"
        print(out["infinity"], flush=True)
    log = Path(f"/tmp/infinity-{args.infinity_port}.log")
    # what infinity said of its device, engine and batching: the figures' first explanation
    text = log.read_bytes().decode(errors="replace") if log.is_file() else ""
    # its start (device, engine, batch size, warm-up) and its end (errors, shutdown)
    out["infinity_log_tail"] = text if len(text) <= 6000 else f"{text[:3000]}\n[...]\n{text[-3000:]}"
    st_rows = []
    for label, half in (("fp32", False), ("fp16", True)):
        model = SentenceTransformer(str(args.model_dir), device="cuda")
        model = model.half() if half else model.float()
        for b in (32, 128, 512):
            st_rows.append(st_speed(model, texts, b, args.seconds / 2, label))
        del model
    best = max(st_rows, key=lambda r: r["sentences_per_s"])
    out["sentence_transformers"], out["st_best"], out["st_best_row"] = st_rows, best["what"], best
    return out


def alone_summary(alone: dict[str, Any], anvil_c16: float) -> dict[str, Any]:
    """The peers measured alone (a --peers-only run of the same call) and Anvil's c16 against them."""
    best = alone["st_best_row"]
    inf = alone["infinity"] if isinstance(alone["infinity"], list) else []
    out: dict[str, Any] = {
        "st_best": best,
        "sentence_transformers": alone["sentence_transformers"],
        "infinity": alone["infinity"],
        "ratio_c16_vs_st_best": round(anvil_c16 / best["sentences_per_s"], 3),
    }
    if inf:
        out["ratio_c16_vs_infinity"] = round(anvil_c16 / inf[0]["sentences_per_s"], 3)
    return out


def write(
    out_dir: Path,
    res: dict[str, Any],
    rows: list[dict[str, Any]],
    inf_rows: list[dict[str, Any]],
    st_rows: list[dict[str, Any]],
    best: dict[str, Any] | None,
    sentences: int,
) -> None:
    """minilm_gpu.json and .md in `out_dir` (also for an Anvil-only run: no peers, no ratios)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "minilm_gpu.json").write_text(json.dumps(res, indent=2) + "\n")
    if best:
        title = "vs sentence-transformers (same run)"
    elif res.get("peers_alone"):
        title = "(--no-peers: the peers were measured alone in the same call, below)"
    else:
        title = "(Anvil only: --no-peers, no ratios)"
    lines = [
        f"# MiniLM on the GPU through the stack {title}",
        "",
        f"Command: `{res['command']}` · commit {res['commit']} · {res['gpu']}",
        f"· {CORPUS}, {sentences} sentences",
        f"· plan {res['plan']} · gateway processes: {res['gateway_workers']}"
        f" · executors per GPU: {res.get('executors_per_gpu', 1)}",
        f"· client: {res['client']['generator']}, {res['client']['processes']} processes, "
        f"encoding_format {res['client']['encoding_format']}, "
        f"{res['client'].get('warmup_s', 0)} s of the same load before each phase, not counted "
        "(every server, same client)",
        "",
        f"Accuracy vs sentence-transformers fp32: {res['accuracy_vs_st_fp32']}",
        *(
            [
                f"INT4 preset (`anvil deploy ... {p4['deploy_options']}`, served as {p4['name']}) vs "
                f"sentence-transformers fp32: {p4['accuracy_vs_st_fp32']}"
            ]
            if (p4 := res.get("int4_preset"))
            else []
        ),
        "",
        "| what | concurrency | format | sentences/s | p50 ms | p99 ms | errors "
        "| hops p50 µs (in/queue/compute/transit (to scheduler/to executor/executor queue/back)) |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['what']} | {r.get('concurrency', 'in process')} | {r.get('encoding_format', '')} | "
            f"{r['sentences_per_s']:,} | "
            f"{r['p50_ms']} | {r['p99_ms']} | {r.get('errors', '')} | {_hops_cell(r)} |"
            for r in rows + inf_rows + st_rows
        ),
        "",
    ]
    if best is not None:
        lines += [
            f"Anvil c16 / best sentence-transformers ({best['what']}): {res['ratio_c16_vs_st_best']}x",
            f"Anvil c16 / infinity-emb c16: {res.get('ratio_c16_vs_infinity', res['infinity'])}",
        ]
    alone = res.get("peers_alone")
    if alone:
        inf = alone["infinity"] if isinstance(alone["infinity"], list) else []
        lines += [
            "",
            "The peers measured alone (before the Anvil stack started, same call, same corpus and client):",
            "",
            "| what | concurrency | sentences/s | p50 ms | p99 ms |",
            "|---|---|---|---|---|",
            *(
                f"| {r['what']} | {r.get('concurrency', 'in process')} | {r['sentences_per_s']:,} | "
                f"{r['p50_ms']} | {r['p99_ms']} |"
                for r in inf + alone["sentence_transformers"]
            ),
            "",
            f"Anvil c16 / best sentence-transformers alone ({alone['st_best']['what']}): "
            f"{alone['ratio_c16_vs_st_best']}x; Anvil c16 / infinity-emb alone c16: "
            f"{alone.get('ratio_c16_vs_infinity', alone['infinity'] if not inf else '-')}",
        ]
    (out_dir / "minilm_gpu.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
