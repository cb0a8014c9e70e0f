"""Where a running stack spends its time under load: py-spy samples of the gateway, scheduler and
executor processes while a closed-loop /v1/embeddings load runs, summarized as each process's
hottest functions (share of its samples, self and total), every process of a service together (the
executors of a GPU host, the gateway's workers), with each process's sample count.

    python bench/profile_stack.py --model minilm-gpu --concurrency 64 --seconds 10 --out-dir OUT
    python bench/profile_stack.py --concurrency 1 --per-request 1 --rate 1000 ...   (a lone sentence)

Needs py-spy on PATH and permission to ptrace the services (root). The load is the same as
bench/minilm_gpu.py's (requests of --per-request corpus-v2 sentences).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from corpus import sentences  # noqa: E402
from minilm_gpu import load  # noqa: E402

SERVICES = {"gateway": "anvil_gateway", "scheduler": "anvil_scheduler", "executor": "anvil_executor"}


def _pgrep(*args: str) -> list[int]:
    out = subprocess.run(["pgrep", *args], capture_output=True, text=True).stdout
    return [int(pid) for pid in out.split()]


def pids() -> dict[str, list[int]]:
    """Every process of each service (a GPU host runs several executors), and the gateway's HTTP
    workers (spawned children of `python -m anvil_gateway`, which only supervises them)."""
    out = {}
    for name, module in SERVICES.items():
        found = _pgrep("-f", "--", f"-m {module}")
        # the workers, not multiprocessing's resource tracker
        children = (
            [c for pid in found for c in _pgrep("-f", "-P", str(pid), "spawn_main")]
            if name == "gateway"
            else []
        )
        if found or children:
            out[name] = children or found
    return out


def summarize(raws: list[Path], top: int) -> dict[str, object]:
    """Collapsed stacks ('f1;f2;f3 count' per line) of one service's processes -> the hottest
    functions by self share and by total share (of all their samples), and the samples per process."""
    self_n: collections.Counter[str] = collections.Counter()
    total_n: collections.Counter[str] = collections.Counter()
    per_process = {}
    samples = 0
    for raw in raws:
        mine = 0
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            mine += n
            frames = stack.split(";")
            self_n[frames[-1]] += n
            for f in set(frames):
                total_n[f] += n
        per_process[raw.stem] = mine
        samples += mine
    samples = max(samples, 1)

    def share(f: str) -> dict[str, object]:
        return {
            "function": f,
            "self_pct": round(100 * self_n[f] / samples, 1),
            "total_pct": round(100 * total_n[f] / samples, 1),
        }

    return {
        "samples": per_process,
        "by_self": [share(f) for f, _ in self_n.most_common(top)],
        "by_total": [share(f) for f, _ in total_n.most_common(top)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", default="http://localhost:8000")
    ap.add_argument("--model", default="minilm-gpu")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--per-request", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=10.0, help="sampling time, s (the load runs 4 s longer)")
    ap.add_argument("--out-dir", type=Path, default=Path("."))
    ap.add_argument("--gil", action="store_true", help="only the thread holding the GIL (py-spy --gil)")
    ap.add_argument("--top", type=int, default=15, help="hottest functions kept per service")
    ap.add_argument("--rate", type=int, default=200, help="py-spy samples per second per process")
    args = ap.parse_args()
    texts = sentences(1000)
    result: dict[str, object] = {"gil_only": args.gil}

    def drive() -> None:
        result["load"] = load(
            args.url, args.model, texts, args.per_request, args.concurrency, args.seconds + 4
        )

    loader = threading.Thread(target=drive)
    loader.start()
    time.sleep(2)  # past the ramp
    procs: dict[str, list[tuple[subprocess.Popen[bytes], Path]]] = {}
    for name, found in pids().items():
        for pid in found:
            raw = args.out_dir / f"pyspy_{name}_{pid}.txt"
            cmd = ["py-spy", "record", "-p", str(pid), "-d", str(int(args.seconds)), "-r", str(args.rate)]
            cmd += ["-f", "raw", "-o", str(raw), "--nonblocking", "--threads"]
            cmd += ["--gil"] if args.gil else []
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs.setdefault(name, []).append((proc, raw))
    for name, runs in procs.items():
        errors = []
        for proc, _ in runs:
            proc.wait()
            if proc.returncode:
                errors.append((proc.stderr.read() if proc.stderr else b"").decode()[-300:])
        raws = [raw for _, raw in runs if raw.exists()]
        result[name] = summarize(raws, args.top) if raws else {"error": errors}
    loader.join()
    print(json.dumps(result, indent=1))
    (args.out_dir / "profile_stack.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
