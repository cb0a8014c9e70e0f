"""Tokenizing corpus-v2 for MiniLM: Hugging Face tokenizers' batch call vs the executor's Python
WordPiece (services/executor/.../models/wordpiece.py), per batch size, in process, same sentences.

TextEmbeddingModel tokenizes batches of at most FAST_ROWS rows in Python; this measures where the
Python path stops paying (tokenizers' call runs parallel and without the GIL; the Python path holds
the GIL). Medians of wall µs per call and per sentence, and the ratio; ids checked equal.

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

    from anvil_executor.models.text_embedding import FAST_ROWS
    from anvil_executor.models.wordpiece import FastWordPiece

    hf = Tokenizer.from_file(str(args.tokenizer))
    hf.enable_truncation(max_length=args.max_tokens)
    hf.no_padding()
    batch_call = getattr(hf, "encode_batch_fast", hf.encode_batch)
    fast = FastWordPiece.from_tokenizer_json(args.tokenizer, args.max_tokens)
    if fast is None:
        sys.exit("this tokenizer.json is not a BERT WordPiece pipeline: no fast path")
    corpus = sentences(1000)
    rows_list = [int(r) for r in args.rows.split(",")]
    table = []
    for rows in rows_list:
        times: dict[str, list[float]] = {"tokenizers": [], "python": []}
        for i in range(args.calls):
            texts = [corpus[(i * rows + j) % len(corpus)] for j in range(rows)]
            t0 = time.perf_counter_ns()
            want = [e.ids for e in batch_call(texts)]
            t1 = time.perf_counter_ns()
            got = [fast.encode(t) for t in texts]
            t2 = time.perf_counter_ns()
            if got != want:
                sys.exit(f"ids differ at rows={rows}, call {i}")
            if i >= 10:  # warm-up: the word cache fills, tokenizers' thread pool starts
                times["tokenizers"].append((t1 - t0) / 1000)
                times["python"].append((t2 - t1) / 1000)
        hf_us, py_us = (statistics.median(times[k]) for k in ("tokenizers", "python"))
        table.append({"rows": rows, "tokenizers_us": round(hf_us, 1), "python_us": round(py_us, 1),
                      "tokenizers_us_per_row": round(hf_us / rows, 1),
                      "python_us_per_row": round(py_us / rows, 1),
                      "python_over_tokenizers": round(py_us / hf_us, 3)})  # fmt: skip
        print(f"rows {rows:>3}: tokenizers {hf_us:8.1f} us, python {py_us:8.1f} us "
              f"({py_us / hf_us:.2f}x), per row {hf_us / rows:6.1f} / {py_us / rows:6.1f} us")  # fmt: skip
    meta = run_meta("bench/tokenize_fast.py")
    out = {"meta": meta, "fast_rows": FAST_ROWS, "calls": args.calls, "rows": table}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tokenize_fast.json").write_text(json.dumps(out, indent=1))
        lines = [
            "# Tokenizing corpus-v2: tokenizers' batch call vs the Python WordPiece (bench/tokenize_fast.py)",
            "",
            f"`{meta['command']}` · commit {meta['commit']} · {meta['machine']} · {meta['date']}",
            f"· FAST_ROWS = {FAST_ROWS} (batches up to it go to Python); "
            f"medians of {args.calls - 10} calls, wall µs",
            "",
            "| rows | tokenizers µs | Python µs | per row tokenizers / Python µs | Python / tokenizers |",
            "|---:|---:|---:|---:|---:|",
        ]
        for r in table:
            per_row = f"{r['tokenizers_us_per_row']} / {r['python_us_per_row']}"
            lines.append(f"| {r['rows']} | {r['tokenizers_us']} | {r['python_us']} | {per_row} | "
                         f"{r['python_over_tokenizers']} |")  # fmt: skip
        (args.out / "tokenize_fast.md").write_text("\n".join(lines) + "\n")
        print(f"wrote {args.out}/tokenize_fast.json and .md")


if __name__ == "__main__":
    main()
