"""The fuzz suites of every boundary (issue #18) at ANVIL_FUZZ_CASES inputs each (default 100,000):
codec, ZeroCopy parsers, gateway link, executor (real sockets), and on a real `anvil up` stack the
scheduler's two ports, the HTTP edge and the ZeroCopy edge. Each suite checks, after every chunk,
that a good request is still answered, and at the end the process id, RSS growth, /metrics line
growth and dict sizes; a failure is a crash, a hang or unbounded growth, and fails its suite.

    uv run python bench/fuzz_long.py [--cases 100000]

Writes bench/results/fuzz_long.{json,md} with the per-boundary counts (docs/security.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SUITES = [
    "libs/core/tests/test_codec_fuzz.py::test_mutations_of_every_message_kind",
    "libs/core/tests/test_zerocopy_fuzz.py::test_mutations_of_valid_frames_and_blocks",
    "services/gateway/tests/test_fuzz_link.py",
    "services/executor/tests/test_fuzz_executor.py",
    "tests/integration/test_fuzz_stack.py",
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=100_000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "fuzz.jsonl"
        env = {**os.environ, "ANVIL_FUZZ_CASES": str(args.cases), "ANVIL_FUZZ_REPORT": str(report)}
        t0 = time.monotonic()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "timeout=7200", *SUITES]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        rows = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    out = {
        "command": f"python bench/fuzz_long.py --cases {args.cases}",
        "commit": commit,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "pytest_exit": proc.returncode,
        "pytest_tail": proc.stdout.splitlines()[-15:],
        "minutes": round((time.monotonic() - t0) / 60, 1),
        "boundaries": rows,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "fuzz_long.json").write_text(json.dumps(out, indent=2))
    lines = [
        "# Fuzz, long run",
        "",
        f"`{out['command']}` at {commit[:10]}; {out['machine']}; {out['minutes']} min;",
        f"pytest exit {proc.returncode}.",
        "(the machine was shared with other work).",
        "",
        "| boundary | inputs | crashes | hangs | RSS growth MB | /metrics lines growth | drops counted | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        cells = [r["boundary"], f"{r['inputs']:,}", r["crashes"], r["hangs"]]
        cells += [
            r.get(k, "-") for k in ("rss_growth_mb", "metric_lines_growth", "dropped_counted", "seconds")
        ]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    (RESULTS / "fuzz_long.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print("\n".join(out["pytest_tail"]))
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
