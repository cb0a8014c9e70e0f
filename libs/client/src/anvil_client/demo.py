"""`anvil demo` (`make demo`): start the stack as `make up` does, with all-MiniLM-L6-v2 loaded, embed a
few sentences through /v1/embeddings, print their cosine-similarity matrix and a latency summary,
then stop everything."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from anvil_client.launcher import Stack, StackError

__all__ = ["SENTENCES", "run_demo"]

SENTENCES = [
    "A man is eating food.",
    "A man is eating a piece of bread.",
    "The girl is carrying a baby.",
    "A man is riding a horse.",
    "A woman is playing violin.",
    "Two men pushed carts through the woods.",
    "A man is riding a white horse on an enclosed ground.",
    "A monkey is playing drums.",
]


def run_demo(compose: Path, rounds: int = 20) -> int:
    env = dict(os.environ)
    env["ANVIL_MODELS"] = env.get("ANVIL_MODELS", "identity,mlp,minilm")
    env.setdefault("ANVIL_SLO_P2_MS", "10000")  # the CPU reference path on a small machine
    stack = Stack(compose, env=env, restart=False)
    try:
        stack.start(timeout_s=120)
    except StackError as exc:
        print(f"anvil demo: {exc}", file=sys.stderr)
        return 1
    try:
        url = stack.gateway_url()
        assert url is not None
        with httpx.Client(base_url=url, timeout=60) as client:
            r = client.post("/v1/embeddings", json={"model": "minilm", "input": SENTENCES})
            if r.status_code != 200:
                print(f"anvil demo: embeddings failed: {r.status_code} {r.text}", file=sys.stderr)
                return 1
            doc: dict[str, Any] = r.json()
            vecs = np.array([d["embedding"] for d in doc["data"]], np.float32)
            print_matrix(vecs)
            latencies = []
            for i in range(rounds):
                t0 = time.perf_counter()
                client.post(
                    "/v1/embeddings", json={"model": "minilm", "input": SENTENCES[i % len(SENTENCES)]}
                )
                latencies.append((time.perf_counter() - t0) * 1e3)
            lat = sorted(latencies)
            print(
                f"\n{rounds} single-sentence requests over HTTP: p50 {statistics.median(lat):.1f} ms, "
                f"max {lat[-1]:.1f} ms; {doc['usage']['total_tokens']} tokens in the batch above"
            )
        return 0
    finally:
        stack.stop()


def print_matrix(vecs: np.ndarray) -> None:
    sims = vecs @ vecs.T  # unit vectors: cosine similarity
    print("cosine similarity (all-MiniLM-L6-v2 through Anvil)\n")
    for i, s in enumerate(SENTENCES):
        print(f"  [{i}] {s}")
    print("\n      " + "".join(f"[{j}]   " for j in range(len(SENTENCES))))
    for i in range(len(SENTENCES)):
        print(f"  [{i}] " + " ".join(f"{sims[i, j]:5.2f}" for j in range(len(SENTENCES))))
