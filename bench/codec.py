"""Wire codec: encode / verify / decode of typical messages, the verified codec (this tree) against
the read and write paths of another commit (default: where this branch left main, before the codec:
fbwrite + fbread lazy views + the scheduler's peer_checks), measured in the same run, alternating.

Cases (one InferRequest or InferResponse with one FP32 tensor; tensor bytes travel in their own
frame, so their size changes only the size checks and the wrap, never the envelope):
  small (1x4), 1KB (256 elements), 1MB (262,144 elements).
Per case and side, median µs per message of:
  encode   build the envelope (gateway for requests, executor for responses)
  read     what a receiver does before using a field: scheduler (request: verify + frame checks),
           gateway (response: verify + output checks), then the tensors as HostTensors
           (old: open_request + peer_checks.check_request + request_tensor; open_response +
           backend._check_response + request_tensor)

    uv run python bench/codec.py [--old-ref <commit>] [--rounds 7] [--iters 3000]

Writes bench/results/codec.{json,md}. The old side runs from `git archive <old-ref>` in a child
process; each round runs both sides once, in alternating order.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
CASES = {"small": (1, 4), "1KB": (1, 256), "1MB": (1, 262_144)}
SRC_DIRS = ["libs/core/src", "services/scheduler/src", "services/gateway/src"]


def _median_us(fn: Any, iters: int) -> float:
    samples = []
    for _ in range(7):
        t0 = time.perf_counter_ns()
        for _ in range(iters // 7):
            fn()
        samples.append((time.perf_counter_ns() - t0) / (iters // 7) / 1000)
    return statistics.median(samples)


def _cases_old(x: Any, iters: int) -> dict[str, float]:
    from anvil_core import infer_codec as old
    from anvil_gateway.backend import _check_response
    from anvil_scheduler.peer_checks import check_request

    payloads: list[Any] = []
    inputs = old.tensor_frames([x], payloads)
    kw = dict(request_id="a" * 32, trace_id="b" * 32, model="mlp", version="1", priority=2)
    kw |= dict(deadline_unix_ns=time.time_ns() + 10**12, tenant="default", outputs=["OUTPUT0"])

    def enc_req() -> bytes:
        return old.build_request(inputs=inputs, **kw)  # type: ignore[arg-type]

    env = enc_req()
    prios = frozenset({1, 2, 3})

    def read_req() -> None:
        view = old.open_request(env)
        check_request(view, payloads, prios)
        [old.request_tensor(view.Inputs(j), payloads) for j in range(view.InputsLength())]

    def enc_resp() -> bytes:
        return old.build_response(request_id="a" * 32, trace_id="b" * 32, model="mlp", version="1",
                                  outputs=inputs, queue_us=10, compute_us=20)  # fmt: skip

    resp = enc_resp()

    def read_resp() -> None:
        view = old.open_response(resp)
        _check_response(view, len(payloads))
        view.Error()
        [old.request_tensor(view.Outputs(j), payloads) for j in range(view.OutputsLength())]

    return _time(enc_req, read_req, enc_resp, read_resp, iters)


def _cases_new(x: Any, iters: int) -> dict[str, float]:
    from anvil_core import codec

    payloads: list[Any] = []
    inputs = codec.tensor_frames([x], payloads)
    kw = dict(request_id="a" * 32, trace_id="b" * 32, model="mlp", version="1", priority=2)
    kw |= dict(deadline_unix_ns=time.time_ns() + 10**12, tenant="default", outputs=["OUTPUT0"])

    def enc_req() -> bytes:
        return codec.build_request(inputs=inputs, **kw)  # type: ignore[arg-type]

    env = enc_req()

    def read_req() -> None:
        req = codec.read_request(env)
        codec.check_payloads(req.inputs, payloads, "input")
        [codec.request_tensor(t, payloads) for t in req.inputs]

    def enc_resp() -> bytes:
        return codec.build_response(request_id="a" * 32, trace_id="b" * 32, model="mlp", version="1",
                                    outputs=inputs, queue_us=10, compute_us=20)  # fmt: skip

    resp = enc_resp()

    def read_resp() -> None:
        r = codec.read_response(resp)
        codec.check_payloads(r.outputs, payloads, "output")
        [codec.request_tensor(t, payloads) for t in r.outputs]

    return _time(enc_req, read_req, enc_resp, read_resp, iters)


def _time(enc_req: Any, read_req: Any, enc_resp: Any, read_resp: Any, iters: int) -> dict[str, float]:
    return {
        "request.encode": _median_us(enc_req, iters),
        "request.read": _median_us(read_req, iters),
        "response.encode": _median_us(enc_resp, iters),
        "response.read": _median_us(read_resp, iters),
    }


def child(side: str, iters: int) -> None:
    import numpy as np

    from anvil_core.tensors import HostTensor

    out = {}
    for case, shape in CASES.items():
        x = HostTensor.from_array("INPUT0", "FP32", np.ones(shape, np.float32))
        out[case] = (_cases_old if side == "old" else _cases_new)(x, iters)
    print(json.dumps(out))


def _old_tree(ref: str, into: Path) -> str:
    raw = subprocess.run(["git", "archive", ref, *SRC_DIRS], cwd=ROOT, capture_output=True, check=True).stdout
    with tarfile.open(fileobj=BytesIO(raw)) as tar:
        tar.extractall(into, filter="data")
    return subprocess.run(["git", "rev-parse", ref], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def _run(side: str, pythonpath: str, iters: int) -> dict[str, dict[str, float]]:
    env = {**os.environ, "PYTHONPATH": pythonpath}
    cmd = [sys.executable, "-u", __file__, "--child", side, "--iters", str(iters)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old-ref", default="", help="default: where this branch left main (merge-base)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--child", choices=["old", "new"])
    args = ap.parse_args()
    if args.child:
        child(args.child, args.iters)
        return
    if not args.old_ref:
        base = subprocess.run(["git", "merge-base", "HEAD", "main"], cwd=ROOT, capture_output=True, text=True)
        args.old_ref = base.stdout.strip() or "main"
    with tempfile.TemporaryDirectory() as tmp:
        old_commit = _old_tree(args.old_ref, Path(tmp))
        paths = {
            "old": os.pathsep.join(str(Path(tmp) / d) for d in SRC_DIRS),
            "new": os.pathsep.join(str(ROOT / d) for d in SRC_DIRS),
        }
        rounds: dict[str, list[dict[str, dict[str, float]]]] = {"old": [], "new": []}
        for r in range(args.rounds):
            for side in ("old", "new") if r % 2 == 0 else ("new", "old"):
                rounds[side].append(_run(side, paths[side], args.iters))
    table: dict[str, dict[str, dict[str, float]]] = {}
    for case in CASES:
        table[case] = {}
        for op in rounds["new"][0][case]:
            old = statistics.median(x[case][op] for x in rounds["old"])
            new = statistics.median(x[case][op] for x in rounds["new"])
            table[case][op] = {"old_us": round(old, 2), "new_us": round(new, 2), "ratio": round(new / old, 3)}
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    meta = {
        "command": " ".join(["python", "bench/codec.py", *sys.argv[1:]]),
        "commit": commit,
        "old_ref": args.old_ref,
        "old_commit": old_commit,
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "load_avg": os.getloadavg(),
        "rounds": args.rounds,
        "iters": args.iters,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "codec.json").write_text(json.dumps({**meta, "results": table}, indent=2))
    lines = [
        "# Wire codec: verified codec vs the old read/write paths",
        "",
        f"`{meta['command']}` at {commit[:10]} (old: {args.old_ref} = {old_commit[:10]}); {meta['machine']};",
        "medians of per-message µs over alternating rounds; the machine was shared with other work.",
        "",
        "| case | op | old µs | new µs | new/old |",
        "|---|---|---|---|---|",
    ]
    for case, ops in table.items():
        for op, v in ops.items():
            lines.append(f"| {case} | {op} | {v['old_us']} | {v['new_us']} | {v['ratio']} |")
    (RESULTS / "codec.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
