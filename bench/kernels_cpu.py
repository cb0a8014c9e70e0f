"""CPU benchmark: anvil_kernels INT4 GEMV/GEMM vs numpy float32 matmul, measured in the same run.

    uv run python bench/kernels_cpu.py [--threads N] [--reps R] [--modes default,wide]
                                       [--shapes 4096x4096,11008x4096] [--batches 1,32]

Each mode runs in a child process (numba's CPU features are fixed at process start):
- default: numba's defaults; on AVX-512 hosts LLVM's tuning still prefers 256-bit vectors.
- wide:    NUMBA_CPU_FEATURES = host features + "-prefer-256-bit" (512-bit vectors in the loops).
numba and BLAS get the same thread count (NUMBA_NUM_THREADS / OPENBLAS_NUM_THREADS / OMP_NUM_THREADS
set before import). int4 and numpy run in interleaved blocks (ROUNDS of each), so both see the
same machine load; the table holds medians after warm-up. Writes bench/results/kernels_cpu.{md,json}
only for a full run: --shapes/--batches (a subset, for quick A/B checks) print the table and write
nothing.
"""

from __future__ import annotations

import argparse
import ctypes
import functools
import glob
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SHAPES = [(4096, 4096), (4096, 11008), (11008, 4096)]  # (K, N)
BATCHES = [1, 8, 32]  # M
GROUP = 128
QUANT_SHAPE = (4096, 11008)
RESULTS = Path(__file__).resolve().parent / "results"
BLAS_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
ROUNDS = 3  # int4 block, numpy block, repeated
SETTLE_S = 0.3  # s, pause before each block so the previous library's spinning threads park


def _openblas_info() -> dict[str, Any]:
    """Core kernel and thread count of the OpenBLAS that numpy loaded (ctypes, no extra deps)."""
    import numpy as np

    info: dict[str, Any] = {}
    libdirs = [Path(np.__file__).parent.parent / "numpy.libs", Path(np.__file__).parent / ".libs"]
    for lib in (p for d in libdirs for p in glob.glob(str(d / "*openblas*.so*"))):
        dll = ctypes.CDLL(lib)
        for sym in dir_symbols(dll, ("scipy_openblas_get_corename64_", "openblas_get_corename")):
            fn = getattr(dll, sym)
            fn.restype = ctypes.c_char_p
            info["corename"] = fn().decode()
        for sym in dir_symbols(dll, ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads")):
            info["threads"] = int(getattr(dll, sym)())
        info["library"] = Path(lib).name
        break
    try:
        from threadpoolctl import threadpool_info  # optional

        info["threadpoolctl"] = threadpool_info()
    except ImportError:
        pass
    return info


def dir_symbols(dll: ctypes.CDLL, names: tuple[str, ...]) -> list[str]:
    """The first of ``names`` that the library exports (as a one-element list), else []."""
    for name in names:
        try:
            getattr(dll, name)
            return [name]
        except AttributeError:
            continue
    return []


def _machine() -> dict[str, Any]:
    import llvmlite
    import numba
    import numpy as np

    model = ""
    if os.path.exists("/proc/cpuinfo"):
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "numba": numba.__version__,
        "llvmlite": llvmlite.__version__,
        "blas_build": {k: blas.get(k) for k in ("name", "version", "openblas configuration")},
        "blas_runtime": _openblas_info(),
        "blas_env": {k: os.environ.get(k) for k in BLAS_ENV},
    }


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e6  # us


def _block(fn: Any, reps: int, warmup: int) -> list[float]:
    """Warm-up calls, then ``reps`` timed calls in a row (us). Blocks, not alternating single
    calls: numba's OpenMP workers and OpenBLAS's threads spin-wait after a parallel region, and
    alternating the two libraries call by call makes each wait for the other's spinning threads.
    The pause lets the other library's threads park first (OpenBLAS spins for ~2**28 cycles)."""
    time.sleep(SETTLE_S)
    for _ in range(warmup):
        fn()
    return [_timed(fn) for _ in range(max(reps, 1))]


def _child(
    mode: str, reps: int, warmup: int, shapes: list[tuple[int, int]], batches: list[int]
) -> dict[str, Any]:
    import numba
    import numpy as np

    import anvil_kernels as ak

    rng = np.random.default_rng(0)
    load_before = os.getloadavg()
    rows = []
    for k, n in shapes:
        w32 = rng.standard_normal((k, n), dtype=np.float32)
        w4 = ak.quantize(w32, group_size=GROUP)
        ws = ak.Workspace()
        for m in batches:
            x = rng.standard_normal((m, k), dtype=np.float32)
            out_q = np.empty((m, n), np.float32)
            out_f = np.empty((m, n), np.float32)
            run_q = functools.partial(ak.int4_linear, x, w4, out_q, workspace=ws)
            run_f = functools.partial(np.matmul, x, w32, out=out_f)
            tq: list[float] = []
            tf: list[float] = []
            for _ in range(ROUNDS):  # interleaved blocks: both see the same machine load
                tq += _block(run_q, reps // ROUNDS, warmup)
                tf += _block(run_f, reps // ROUNDS, warmup)
            rows.append(
                {
                    "K": k,
                    "N": n,
                    "M": m,
                    "int4_us": statistics.median(tq),
                    "numpy_fp32_us": statistics.median(tf),
                    "speedup": statistics.median(tf) / statistics.median(tq),
                    "int4_weight_bytes": w4.nbytes,
                    "fp32_weight_bytes": w32.nbytes,
                }
            )
            print(f"[{mode}] K={k} N={n} M={m} int4 {rows[-1]['int4_us']:.0f} us", file=sys.stderr)
    wq = rng.standard_normal(QUANT_SHAPE, dtype=np.float32)
    ak.quantize(wq[:256], group_size=GROUP, clip_search=True)  # compile outside the timing
    quant = {
        "rtn_s": min(_timed(lambda: ak.quantize(wq, group_size=GROUP)) for _ in range(3)) / 1e6,
        "clip_search_s": _timed(lambda: ak.quantize(wq, group_size=GROUP, clip_search=True)) / 1e6,
    }
    return {
        "mode": mode,
        "numba_threads": numba.get_num_threads(),
        "numba_threading_layer": numba.threading_layer(),
        "numba_cpu_features": os.environ.get("NUMBA_CPU_FEATURES", "(default)"),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "reps": reps,
        "warmup": warmup,
        "rows": rows,
        "quantize_4096x11008": quant,
        "machine": _machine(),
    }


def _env_for(mode: str, threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for var in ("NUMBA_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = str(threads)
    env.pop("NUMBA_CPU_FEATURES", None)
    if mode == "wide":
        import llvmlite.binding as ll

        env["NUMBA_CPU_FEATURES"] = ll.get_host_cpu_features().flatten() + ",-prefer-256-bit"
    return env


def _table(run: dict[str, Any]) -> list[str]:
    lines = [
        "| K | N | M | INT4 (us) | numpy fp32 (us) | speedup | target | met |",
        "|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in run["rows"]:
        target, met = "-", "-"
        if r["M"] == 1:
            target, met = ">= 3x", "yes" if r["speedup"] >= 3.0 else "NO"
        elif r["M"] == 32:
            target, met = ">= 1x", "yes" if r["speedup"] >= 1.0 else "NO"
        lines.append(
            f"| {r['K']} | {r['N']} | {r['M']} | {r['int4_us']:.0f} | {r['numpy_fp32_us']:.0f} | "
            f"{r['speedup']:.2f}x | {target} | {met} |"
        )
    q = run["quantize_4096x11008"]
    lines.append("")
    lines.append(
        f"Quantize 4096x11008 (g=128, fp16 scales): RTN {q['rtn_s']:.3f} s (target < 1 s), "
        f"with clip search {q['clip_search_s']:.3f} s."
    )
    return lines


def _markdown(runs: list[dict[str, Any]], threads: int) -> str:
    m = runs[0]["machine"]
    rt = m["blas_runtime"]
    out = [
        "# anvil_kernels CPU benchmark (generated by bench/kernels_cpu.py)",
        "",
        f"- CPU: {m['cpu']}, {m['cores']} cores; Python {m['python']}, numpy {m['numpy']}, "
        f"numba {m['numba']}, llvmlite {m['llvmlite']}",
        f"- BLAS: {m['blas_build'].get('name')} {m['blas_build'].get('version')}; runtime core "
        f"kernel `{rt.get('corename', 'unknown')}`, {rt.get('threads', '?')} BLAS threads; "
        f"numba threads {runs[0]['numba_threads']} ({runs[0]['numba_threading_layer']} layer); "
        f"requested {threads} for both",
        f"- BLAS env: {m['blas_env']}",
        f"- Weight group size {GROUP}, fp16 scales; medians of {runs[0]['reps']} reps in {ROUNDS} "
        f"interleaved blocks, each after {runs[0]['warmup']} warm-up calls; speedup = numpy / INT4.",
        "",
    ]
    for run in runs:
        out.append(f"## mode `{run['mode']}`")
        out.append("")
        out.append(
            f"Load average before/after: {tuple(round(x, 2) for x in run['load_avg_before'])} / "
            f"{tuple(round(x, 2) for x in run['load_avg_after'])}"
        )
        out.append("")
        out.extend(_table(run))
        out.append("")
    return "\n".join(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--modes", default="default,wide")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--notes", default="", help="a markdown paragraph appended to the report")
    ap.add_argument("--shapes", default=",".join(f"{k}x{n}" for k, n in SHAPES), help="KxN,...")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)), help="M,...")
    args = ap.parse_args()
    shapes = [(int(k), int(n)) for k, n in (s.split("x") for s in args.shapes.split(","))]
    batches = [int(m) for m in args.batches.split(",")]
    if args.child:
        print(json.dumps(_child(args.child, args.reps, args.warmup, shapes, batches)))
        return
    runs = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--child", mode]
        cmd += ["--reps", str(args.reps), "--warmup", str(args.warmup)]
        cmd += ["--shapes", args.shapes, "--batches", args.batches]
        proc = subprocess.run(cmd, env=_env_for(mode, args.threads), capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"mode {mode} failed:\n{proc.stderr}")
        runs.append(json.loads(proc.stdout))
    md = _markdown(runs, args.threads) + ("\n" + args.notes + "\n" if args.notes else "")
    print(md)
    if shapes != SHAPES or batches != BATCHES:
        return  # a subset: not the report
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "kernels_cpu.md").write_text(md)
    (RESULTS / "kernels_cpu.json").write_text(json.dumps({"threads": args.threads, "runs": runs}, indent=2))


if __name__ == "__main__":
    main()
