"""Gateway overhead: the `identity` model through HTTP JSON, HTTP binary, HTTP + system shared memory
and ZeroCopy, with 1 KB and 1 MB inputs, at concurrency 1 and 16 (p50/p99 and req/s).

HTTP is driven by wrk (a C load generator, so the client is not what is measured); ZeroCopy by
`anvil_client.ZeroCopyClient` (Python), and, for a like-for-like comparison, HTTP binary is also
driven from Python (`anvil_client.rawhttp`) at concurrency 1. The script starts its own stack
(`anvil up`, client shm allowed) on free ports and writes bench/results/gateway_overhead.{json,md}.

    uv run python bench/gateway_overhead.py [--seconds 5]

`--baseline TREE` measures instead the CPU cost per request of the request path (gateway +
scheduler + executor processes, utime + stime from /proc over each round / requests wrk completed)
of this tree's stack with its defaults (auth on) against the stack of another checkout TREE (its own
`.venv`), both started here on free ports, the order alternating every round, medians of the rounds;
writes bench/results/gateway_cpu_vs_base.{json,md}:

    flock /tmp/anvil-timing.lock uv run python bench/gateway_overhead.py --baseline ../base --rounds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from anvil_client.launcher import private_port_env
from anvil_core import keys

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SIZES = {"1KB": 256, "1MB": 262_144}  # FP32 elements
CONCURRENCY = (1, 16)


def start_stack(
    tmp: Path, extra: dict[str, str] | None = None, root: Path = ROOT, python: str = sys.executable
) -> tuple[subprocess.Popen[str], dict[str, str], str]:
    """`anvil up` of the checkout `root` (run by `python`) on free ports in a private run root;
    waits for its ready line."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANVIL_")}
    env.update(private_port_env(root / "compose.yaml"))
    env.update(
        {
            "ANVIL_RUN_ROOT": str(tmp / "run"),
            "ANVIL_PROFILES": "cpu",
            "ANVIL_ALLOW_CLIENT_SHM": "1",
            "ANVIL_SLO_P3_MS": "30000",
            "ANVIL_MAX_BODY_BYTES": str(64 << 20),
            "PYTHONUNBUFFERED": "1",
        }
    )
    env.update(extra or {})
    proc = subprocess.Popen(
        [python, "-m", "anvil_client.cli", "up", "--no-restart", "--timeout", "180"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("anvil: ready"):
            break
    else:
        raise SystemExit("the stack did not start")
    return proc, env, f"http://127.0.0.1:{env['ANVIL_HTTP_PORT']}"


def wrk(url: str, lua: Path, conns: int, seconds: int) -> dict[str, float]:
    out = subprocess.run(
        ["wrk", "-t1", f"-c{conns}", f"-d{seconds}s", "--latency", "-s", str(lua), url],
        capture_output=True,
        text=True,
        check=True,
    ).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s+{label}%\s+([0-9.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[m.group(2)]

    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "p50_ms": ms("50"),
        "p99_ms": ms("99"),
        "rps": rps,
        "non2xx": int(errors.group(1)) if errors else 0,
    }


def lua_for(body_file: Path, headers: dict[str, str]) -> Path:
    lines = ['wrk.method = "POST"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    lines += [f'local f = io.open("{body_file}", "rb")', "wrk.body = f:read('*all')", "f:close()"]
    path = body_file.with_suffix(".lua")
    path.write_text("\n".join(lines) + "\n")
    return path


def bodies(tmp: Path, n: int, url: str) -> dict[str, tuple[Path, dict[str, str]]]:
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    out: dict[str, tuple[Path, dict[str, str]]] = {}
    js = {
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, n], "data": x.ravel().tolist()}],
        "parameters": {"priority": 3},
    }
    (tmp / f"json{n}.bin").write_bytes(json.dumps(js).encode())
    out["http_json"] = (tmp / f"json{n}.bin", {"Content-Type": "application/json"})
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, n],
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "parameters": {"priority": 3, "binary_data_output": True},
        }
    ).encode()
    (tmp / f"bin{n}.bin").write_bytes(head + x.tobytes())
    out["http_binary"] = (
        tmp / f"bin{n}.bin",
        {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))},
    )
    # system shared memory: the input and the output live in two registered regions
    import httpx

    tag = uuid.uuid4().hex[:8]
    for role in ("in", "out"):
        key = f"/anvil-bench-{role}-{n}-{tag}"
        fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        os.ftruncate(fd, x.nbytes)
        if role == "in":
            os.pwrite(fd, x.tobytes(), 0)
        os.close(fd)
        r = httpx.post(
            f"{url}/v2/systemsharedmemory/region/{role}{n}{tag}/register",
            json={"key": key, "offset": 0, "byte_size": x.nbytes},
            timeout=10,
        )
        r.raise_for_status()
    shm = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, n],
                "parameters": {"shared_memory_region": f"in{n}{tag}", "shared_memory_byte_size": x.nbytes},
            }
        ],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {"shared_memory_region": f"out{n}{tag}", "shared_memory_byte_size": x.nbytes},
            }
        ],
        "parameters": {"priority": 3},
    }
    (tmp / f"shm{n}.bin").write_bytes(json.dumps(shm).encode())
    out["http_shm"] = (tmp / f"shm{n}.bin", {"Content-Type": "application/json"})
    return out


async def python_http(
    url: str, body: bytes, headers: dict[str, str], conns: int, seconds: float
) -> dict[str, float]:
    from anvil_client.rawhttp import RawHttpPool

    pool = RawHttpPool(url, size=conns)
    lat: list[float] = []
    stop = time.monotonic() + seconds

    async def worker() -> None:
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            r = await pool.request("POST", "/v2/models/identity/infer", body, headers)
            assert r.status == 200, r.text[:200]
            lat.append(time.perf_counter() - t0)

    t0 = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(conns)))
    el = time.monotonic() - t0
    await pool.close()
    return summary(lat, el)


def summary(lat: list[float], elapsed_s: float) -> dict[str, float]:
    a = np.sort(np.array(lat)) * 1e3
    return {
        "p50_ms": float(np.percentile(a, 50)),
        "p99_ms": float(np.percentile(a, 99)),
        "rps": len(a) / elapsed_s,
        "non2xx": 0,
    }


def zerocopy(env: dict[str, str], n: int, conns: int, seconds: float) -> dict[str, float] | None:
    try:
        from anvil_client import ZeroCopyClient  # type: ignore[attr-defined]
    except ImportError:
        return None
    endpoint = zerocopy_endpoint(env)
    if endpoint is None:
        return None
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    lat: list[float] = []
    if conns == 1:
        with ZeroCopyClient(endpoint, slots=2, slot_bytes=max(1 << 16, 2 * x.nbytes + 4096)) as client:
            client.infer("identity", {"INPUT0": x})
            stop = time.monotonic() + seconds
            t_start = time.monotonic()
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                client.infer("identity", {"INPUT0": x})
                lat.append(time.perf_counter() - t0)
            return summary(lat, time.monotonic() - t_start)
    from anvil_client import AsyncZeroCopyClient  # type: ignore[attr-defined]

    async def run() -> dict[str, float]:
        client = await AsyncZeroCopyClient.connect(
            endpoint, slots=conns, slot_bytes=max(1 << 16, 2 * x.nbytes + 4096)
        )
        stop = time.monotonic() + seconds

        async def worker() -> None:
            while time.monotonic() < stop:
                t0 = time.perf_counter()
                await client.infer("identity", {"INPUT0": x})
                lat.append(time.perf_counter() - t0)

        t_start = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(conns)))
        el = time.monotonic() - t_start
        await client.close()
        return summary(lat, el)

    return asyncio.run(run())


def zerocopy_endpoint(env: dict[str, str]) -> str | None:
    from anvil_client.stack_redis import open_redis

    r = open_redis(env=env, decode_responses=True)  # the stack's URL and password, from its state file
    for key in r.scan_iter(keys.svc_pattern("gateway")):
        ep = r.hget(key, "zerocopy_endpoint")
        if ep:
            return str(ep)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=int, default=5)
    ap.add_argument("--baseline", type=Path, help="another checkout: CPU per request, this tree vs it")
    ap.add_argument("--rounds", type=int, default=5, help="with --baseline")
    ap.add_argument("--profile", action="store_true", help="with --baseline: py-spy both stacks after")
    ap.add_argument("--sizes", nargs="*", default=[], help="with --baseline: only these sizes (1KB 64KB 1MB)")
    ap.add_argument("--profile-size", default="1KB", help="with --profile: the binary requests' size")
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is required (apt-get install wrk)")
    if args.baseline is not None:
        from gateway_cpu import compare

        compare(
            args.baseline.resolve(),
            args.seconds,
            args.rounds,
            args.profile,
            tuple(args.sizes),
            args.profile_size,
        )
        return
    tmp = Path(tempfile.mkdtemp(prefix="anvil-gw-bench-"))
    proc, env, url = start_stack(tmp)
    rows: list[dict[str, Any]] = []
    try:
        for size, n in SIZES.items():
            variants = bodies(tmp, n, url)
            for transport, (body, headers) in variants.items():
                lua = lua_for(body, headers)
                for c in CONCURRENCY:
                    r = wrk(f"{url}/v2/models/identity/infer", lua, c, args.seconds)
                    rows.append(
                        {"size": size, "transport": transport, "client": "wrk", "concurrency": c, **r}
                    )
                    print(rows[-1], flush=True)
            body, headers = variants["http_binary"]
            for c in CONCURRENCY:
                r = asyncio.run(python_http(url, body.read_bytes(), headers, c, args.seconds))
                rows.append(
                    {"size": size, "transport": "http_binary", "client": "python", "concurrency": c, **r}
                )
                print(rows[-1], flush=True)
                z = zerocopy(env, n, c, args.seconds)
                if z is not None:
                    rows.append(
                        {"size": size, "transport": "zerocopy", "client": "python", "concurrency": c, **z}
                    )
                    print(rows[-1], flush=True)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        for f in Path("/dev/shm").glob("anvil-bench-*"):
            f.unlink(missing_ok=True)
    write(rows, args.seconds)


def write(rows: list[dict[str, Any]], seconds: int) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "seconds_per_point": seconds,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    (RESULTS / "gateway_overhead.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [
        "# Gateway overhead (identity model)",
        "",
        f"{meta['date']}, {meta['machine']}, Python {meta['python']}; every process of the stack and the "
        "load generator share these cores. `uv run python bench/gateway_overhead.py`.",
        "",
        "| size | transport | client | conc. | p50 ms | p99 ms | req/s | non-2xx |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['size']} | {r['transport']} | {r['client']} | {r['concurrency']} | {r['p50_ms']:.2f} | "
            f"{r['p99_ms']:.2f} | {r['rps']:.0f} | {r['non2xx']} |"
        )

    def find(size: str, transport: str, client: str, c: int) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in rows
                if (r["size"], r["transport"], r["client"], r["concurrency"]) == (size, transport, client, c)
            ),
            None,
        )

    lines += ["", "## Targets"]
    zc, hb = find("1MB", "zerocopy", "python", 1), find("1MB", "http_binary", "python", 1)
    if zc and hb:
        ratio = zc["p50_ms"] / hb["p50_ms"]
        lines.append(
            f"- ZeroCopy p50 / HTTP-binary p50 at 1 MB (both Python clients, c=1): {ratio:.2f} "
            f"(target <= 0.5): {'met' if ratio <= 0.5 else 'missed'}"
        )
    hb16 = find("1KB", "http_binary", "wrk", 16)
    if hb16:
        lines.append(
            f"- HTTP binary, 1 KB, concurrency 16: {hb16['rps']:.0f} req/s (target >= 3,000): "
            f"{'met' if hb16['rps'] >= 3000 else 'missed'}"
        )
    (RESULTS / "gateway_overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
