"""The wire codec's per-message cost on the request path, this tree against another checkout, in
the same run: build and read of an InferRequest (gateway -> scheduler -> executor) and an
InferResponse (executor -> gateway) with one 1 KB FP32 tensor, and pack/unpack of a Batch and a
BatchResult around them (scheduler <-> executor). Median µs per message over 9 x 1,000 calls per
side and round, rounds alternating which side runs first.

    uv run python bench/codec_paths.py --baseline TREE [--rounds 5] [--name codec_paths]

TREE: a checkout of another commit (e.g. `git worktree add /tmp/base HEAD~1`); its libs/core/src
goes first on the child's PYTHONPATH. Writes bench/results/<name>.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


def measure() -> dict[str, float]:
    import numpy as np

    from anvil_core import codec
    from anvil_core.codec import pb
    from anvil_core.tensors import HostTensor

    x = HostTensor.from_array("INPUT0", "FP32", np.zeros((1, 256), np.float32))
    rid, tid = "5f0c6a5e-9d7b-4a8e-b7a2-1f3e5d7c9b11", "0af7651916cd43dd8448eb211c80319c"
    timing = codec.BatchTiming(size=1, input_us=10, infer_us=10, output_us=1, exec_queue_us=0,
                               dispatched_unix_ns=1, executor_in_unix_ns=2, done_unix_ns=3)  # fmt: skip

    def build_request() -> bytes:
        inputs = codec.tensor_frames([x], [])
        return codec.build_request(request_id=rid, trace_id=tid, model="identity", version="", priority=2,
                                   deadline_unix_ns=2**62, tenant="", inputs=inputs)  # fmt: skip

    def build_response() -> bytes:
        return codec.build_response(request_id=rid, trace_id=tid, model="identity", version="1",
                                    outputs=codec.tensor_frames([x], []), queue_us=3, compute_us=100,
                                    batch=timing, batch_index=0)  # fmt: skip

    def batch() -> pb.BatchT:
        return pb.BatchT(batchId="123", model="identity", frameCounts=[2], queueUs=[5], replyTo=["gw-1"])

    req, resp = build_request(), build_response()
    packed_batch = codec.pack(batch(), [req, b"x" * 1024])
    result = pb.BatchResultT(batchId="123", executorId="ex-1", computeUs=300, frameCounts=[2])
    packed_result = codec.pack(result, [resp, b"x"])
    cases = {
        "request.build": build_request,
        "request.read": lambda: codec.read_request(req),
        "response.build": build_response,
        "response.read": lambda: codec.read_response(resp),
        "batch.pack": lambda: codec.pack(batch(), [req]),
        "batch.unpack": lambda: codec.unpack(packed_batch),
        "result.unpack": lambda: codec.unpack(packed_result),
    }
    out = {}
    for name, fn in cases.items():
        for _ in range(300):
            fn()
        samples = []
        for _ in range(9):
            t0 = time.perf_counter_ns()
            for _ in range(1000):
                fn()
            samples.append((time.perf_counter_ns() - t0) / 1000 / 1000)
        out[name] = round(statistics.median(samples), 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout, measured alike")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--name", default="codec_paths")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure()))
        return
    trees = {"now": ROOT, "base": args.baseline.resolve()}
    rows: dict[str, list[dict[str, float]]] = {k: [] for k in trees}
    for rnd in range(args.rounds):
        for name in list(trees)[:: 1 if rnd % 2 == 0 else -1]:
            env = {**os.environ, "PYTHONPATH": f"{trees[name]}/libs/core/src"}
            cmd = [sys.executable, str(Path(__file__).resolve()), "--child", "--baseline", str(args.baseline)]
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
            rows[name].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(name, rnd, rows[name][-1], flush=True)
    sys.path.insert(0, str(ROOT / "bench"))
    from run_meta import run_meta

    meta = run_meta("bench/codec_paths.py")
    base_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=trees["base"],
                                 capture_output=True, text=True).stdout.strip()  # fmt: skip
    cases = list(rows["now"][0])
    med = {k: {c: statistics.median(r[c] for r in rs) for c in cases} for k, rs in rows.items()}
    doc: dict[str, Any] = {"meta": meta, "base_commit": base_commit, "rounds": args.rounds,
                           "median_us": med, "rounds_us": rows}  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(doc, indent=1))
    lines = [
        f"# Wire codec per message: {meta['commit']} (`now`) vs {base_commit} (`base`)",
        "",
        f"`{meta['command']}` · {meta['machine']} · {meta['date']} · load {meta['load_1min_at_end']}",
        "",
        f"Median µs per message over {args.rounds} alternating rounds (each the median of 9 x 1,000 calls).",
        "",
        "| message | now µs | base µs | now / base |",
        "|---|---:|---:|---:|",
    ]
    for c in cases:
        a, b = med["now"][c], med["base"][c]
        lines.append(f"| {c} | {a:.2f} | {b:.2f} | {a / b:.3f} |")
    tot_a, tot_b = sum(med["now"].values()), sum(med["base"].values())
    lines.append(f"| all seven | {tot_a:.2f} | {tot_b:.2f} | {tot_a / tot_b:.3f} |")
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
