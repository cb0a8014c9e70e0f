"""Tokenizing corpus-v2 for MiniLM: Hugging Face tokenizers' batch call vs the executor's compiled
WordPiece (services/executor/.../models/wordpiece.py), per batch size, in process, same sentences.

TextEmbeddingModel tokenizes every ASCII row with the compiled WordPiece (numba, without the GIL) and
leaves the rest to tokenizers' call (parallel over its thread pool, without the GIL). Medians of
wall µs per call and per sentence, the CPU time of the process per call (every thread: tokenizers'
pool included), and the ratios; ids checked equal.

    python bench/tokenize_fast.py --tokenizer DIR/tokenizer.json [--rows 1,2,4,8,16,32,64] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus import sentences  # noqa: E402
from run_meta import run_meta  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", type=Path, required=True, help="a BERT tokenizer.json")
    ap.add_argument("--rows", default="1,2,4,8,16,32,64")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--calls", type=int, default=300, help="calls per batch size and tokenizer")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    from tokenizers import Tokenizer

    from anvil_executor.models.wordpiece import FastWordPiece

    hf = Tokenizer.from_file(str(args.tokenizer))
    hf.enable_truncation(max_length=args.max_tokens)
    hf.no_padding()
    batch_call = getattr(hf, "encode_batch_fast", hf.encode_batch)
    fast = FastWordPiece.from_tokenizer_json(args.tokenizer, args.max_tokens)
    if fast is None:
        sys.exit("this tokenizer.json is not a BERT WordPiece pipeline: no fast path")
    corpus = [t.encode() for t in sentences(1000)]  # rows arrive as bytes
    rows_list = [int(r) for r in args.rows.split(",")]
    table = []
    for rows in rows_list:
        wall: dict[str, list[float]] = {"tokenizers": [], "compiled": []}
        cpu = {"tokenizers": 0.0, "compiled": 0.0}
        for i in range(args.calls):
            raw = [corpus[(i * rows + j) % len(corpus)] for j in range(rows)]
            texts = [t.decode() for t in raw]
            c0, t0 = time.process_time_ns(), time.perf_counter_ns()
            want = [e.ids for e in batch_call(texts)]
            c1, t1 = time.process_time_ns(), time.perf_counter_ns()
            ids, counts = fast.encode_batch(raw)
            c2, t2 = time.process_time_ns(), time.perf_counter_ns()
            if [ids[r, : counts[r]].tolist() for r in range(rows)] != want:
                sys.exit(f"ids differ at rows={rows}, call {i}")
            if i >= 10:  # warm-up: compilation, tokenizers' thread pool starts
                wall["tokenizers"].append((t1 - t0) / 1000)
                wall["compiled"].append((t2 - t1) / 1000)
                cpu["tokenizers"] += (c1 - c0) / 1000
                cpu["compiled"] += (c2 - c1) / 1000
        hf_us, jit_us = (statistics.median(wall[k]) for k in ("tokenizers", "compiled"))
        hf_cpu, jit_cpu = (cpu[k] / (args.calls - 10) for k in ("tokenizers", "compiled"))
        table.append({"rows": rows, "tokenizers_us": round(hf_us, 1), "compiled_us": round(jit_us, 1),
                      "tokenizers_us_per_row": round(hf_us / rows, 2),
                      "compiled_us_per_row": round(jit_us / rows, 2),
                      "tokenizers_cpu_us": round(hf_cpu, 1), "compiled_cpu_us": round(jit_cpu, 1),
                      "compiled_over_tokenizers": round(jit_us / hf_us, 3),
                      "cpu_compiled_over_tokenizers": round(jit_cpu / hf_cpu, 3)})  # fmt: skip
        print(f"rows {rows:>3}: tokenizers {hf_us:8.1f} us (CPU {hf_cpu:8.1f}), compiled {jit_us:8.1f} us "
              f"(CPU {jit_cpu:8.1f}); wall {jit_us / hf_us:.3f}x, CPU {jit_cpu / hf_cpu:.3f}x")  # fmt: skip
    meta = run_meta("bench/tokenize_fast.py")
    out = {"meta": meta, "calls": args.calls, "rows": table}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tokenize_fast.json").write_text(json.dumps(out, indent=1))
        lines = [
            "# Tokenizing corpus-v2: tokenizers' batch call vs the compiled WordPiece "
            "(bench/tokenize_fast.py)",
            "",
            f"`{meta['command']}` · commit {meta['commit']} · {meta['machine']} · {meta['date']}",
            f"· medians of {args.calls - 10} calls (wall µs); CPU µs = the process's CPU time per call, "
            "every thread (tokenizers' pool) included; rows arrive as bytes",
            "",
            "| rows | tokenizers µs | compiled µs | per row tokenizers / compiled µs "
            "| CPU tokenizers / compiled µs | wall compiled / tokenizers | CPU compiled / tokenizers |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in table:
            lines.append(f"| {r['rows']} | {r['tokenizers_us']} | {r['compiled_us']} | "
                         f"{r['tokenizers_us_per_row']} / {r['compiled_us_per_row']} | "
                         f"{r['tokenizers_cpu_us']} / {r['compiled_cpu_us']} | "
                         f"{r['compiled_over_tokenizers']} | "
                         f"{r['cpu_compiled_over_tokenizers']} |")  # fmt: skip
        (args.out / "tokenize_fast.md").write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}/tokenize_fast.json and .md")


if __name__ == "__main__":
    main()
