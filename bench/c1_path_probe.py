"""Where a lone one-sentence request's executor time goes (issue #16: c1 p50 <= 1.5 ms; the H200 runs
report the executor's "compute" hop at ~925 µs for one sentence while the fp16 graph of the smallest
bucket replays in ~0.2 ms).

In process, no stack: the MiniLM artifact compiled as the executor's GPU plan (fp16), loaded the way
the executor loads it (``artifact.load_artifact``), then ``--n`` one-sentence calls, each split into
the phases the compute hop covers: ``prepare`` (tokenize), ``stage`` (the request's rows into the
pinned input slots), ``launch`` (the graph launch), ``sync`` (waiting for the GPU), ``outputs``
(pooled vectors back to fp32 numpy), and the rest of ``run_prepared``. Also the graph replay alone
(CUDA events) for the same bucket. Prints the medians (µs) and writes ``--out``/c1_path_probe.json.

    python3 bench/c1_path_probe.py --model-dir DIR [--n 500] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
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
from run_meta import run_meta  # noqa: E402


def _timed(obj: Any, name: str, acc: dict[str, list[float]], label: str) -> None:
    """Wrap obj.name so each call's wall time (µs) lands in acc[label]."""
    fn = getattr(obj, name)

    def wrapper(*a: Any, **kw: Any) -> Any:
        t = time.perf_counter_ns()
        try:
            return fn(*a, **kw)
        finally:
            acc[label].append((time.perf_counter_ns() - t) / 1000)

    try:
        setattr(obj, name, wrapper)
    except (AttributeError, TypeError):  # an extension type without an instance dict
        print(f"cannot time {type(obj).__name__}.{name}; left out", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()

    import cupy as cp

    from anvil_client.deploy import hf_bundle
    from anvil_compiler.options import CompileOptions
    from anvil_compiler.pipeline import compile_model
    from anvil_executor.artifact import load_artifact
    from anvil_executor.device import parse_device

    arch = f"sm_{cp.cuda.Device(0).compute_capability}"
    tmp = Path(tempfile.mkdtemp(prefix="c1_probe_"))
    t0 = time.time()
    opts = CompileOptions(quantize=False, max_batch=512, max_seq=128, archs=(arch,), gpu_precision="fp16")
    compile_model("hf", hf_bundle(args.model_dir), "minilm", opts, tmp, key="c1")
    model, plan = load_artifact(tmp, parse_device("cuda:0"), "minilm")
    print(f"compiled and loaded in {time.time() - t0:.1f} s", flush=True)
    acc: dict[str, list[float]] = defaultdict(list)
    _timed(plan, "_stage", acc, "stage")
    _timed(plan, "_run_chunk", acc, "run_chunk")
    _timed(plan.stream, "synchronize", acc, "sync")
    if getattr(plan, "_done", None) is not None:
        _timed(plan._done, "synchronize", acc, "sync")
    texts = sentences(args.n)
    for i, text in enumerate(texts):
        inputs = {"TEXT": np.array([text.encode()], dtype=object)}
        t = time.perf_counter_ns()
        prepared = model.prepare([inputs])
        t1 = time.perf_counter_ns()
        model.run_prepared(prepared)
        t2 = time.perf_counter_ns()
        if i >= 20:  # warm
            acc["prepare"].append((t1 - t) / 1000)
            acc["run_prepared"].append((t2 - t1) / 1000)
            acc["total"].append((t2 - t) / 1000)
    for k in ("stage", "run_chunk", "sync"):
        acc[k] = acc[k][-len(acc["total"]) :]
    med = {k: round(statistics.median(v), 1) for k, v in acc.items() if v}
    med["outputs_and_rest"] = round(med["run_prepared"] - med["run_chunk"], 1)
    med["launch_and_fetch"] = round(med["run_chunk"] - med["stage"] - med.get("sync", 0.0), 1)
    everything = {"TEXT": np.array([s.encode() for s in texts], dtype=object)}
    lens = [int(c) for c in model.prepare([everything]).counts]
    res = {**run_meta("bench/c1_path_probe.py"), "medians_us": med, "tokens_p50": statistics.median(lens)}
    res["n"] = len(acc["total"])
    print(json.dumps(res, indent=1), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "c1_path_probe.json").write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
