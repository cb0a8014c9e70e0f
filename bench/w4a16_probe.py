"""Probe the GEMV-like W4A16 kernel's launch space on the GPU (issue #17: M <= 16 sits at ~54% of the
streaming read of the same bytes; which of occupancy, bytes in flight or split-K limits it).

Builds ``w4a16.cu`` with extra instantiations of both NS = 1 bodies (``old``: ``w4a16_body``;
``new``: ``w4a16_stream_body``, the default since the ninth session): groups in flight ``gd`` and
ptxas's blocks-per-SM hint
(``__launch_bounds__(32 * sn * sk, minb)``, which caps registers so more warps fit), then times each
(variant, sk, sn) at each M exactly as ``bench/kernels_gpu.py`` times kernels (CUDA-graph replay over
6 rotating weight copies, cold L2), beside the streaming read of the same bytes and cuBLAS bf16.
Every launch's output is checked against the default kernel's (a variant that writes anything else
is reported, not timed).

    python3 bench/w4a16_probe.py --out DIR [--shapes 8192x8192] [--ms 1,16]
    python3 bench/w4a16_probe.py --cases     # one launch per ncu case (run it under ncu)

The ncu run of the eleventh session (the wg tiles' stall reasons and tensor-pipe use):
    ncu --clock-control none --kernel-name regex:'w4a16(wg|mtc)' --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section WarpStateStats --section Occupancy \
      python3 bench/w4a16_probe.py --cases

Writes DIR/w4a16_probe.json (and prints a table).
"""

from __future__ import annotations

import argparse
import itertools
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu import COPIES, GROUP, _graph_cupy, _graph_torch, _helpers_module, _stream_us, random_weight

# (mt, gd, maxt, minb): M tile of 8*mt rows, gd groups in flight (D = gd * 2 chunks at g128),
# __launch_bounds__(maxt, minb): at most maxt threads a block, ptxas caps registers so minb blocks fit
VARIANTS: list[tuple[int, int, int, int]] = [
    (1, 1, 512, 1), (1, 2, 512, 1), (1, 4, 512, 1), (1, 8, 512, 1),
    (1, 2, 128, 6), (1, 2, 128, 8), (1, 1, 128, 8), (1, 4, 128, 5), (1, 2, 256, 3), (1, 2, 256, 4),
    (2, 1, 512, 1), (2, 2, 512, 1), (2, 4, 512, 1), (2, 2, 128, 6), (2, 1, 128, 8),
]  # fmt: skip
SKS = (1, 2, 4, 8, 16)
SNS = (1, 2)


BODIES = {"old": "w4a16_body<0, {mt}, 1, {cpg}, {gd}>", "new": "w4a16_stream_body<0, {mt}, {cpg}, {d}>"}


def _name(mt: int, gd: int, maxt: int, minb: int, body: str = "new") -> str:
    return f"probe_{body}_m{mt}_g{gd}_t{maxt}_b{minb}"


def source() -> str:
    from anvil_kernels.cuda import w4a16

    body = Path(w4a16.__file__).with_name("w4a16.cu").read_text()
    out = [body]
    cpg = GROUP // 64
    for (mt, gd, maxt, minb), body in itertools.product(VARIANTS, BODIES):
        fn = BODIES[body].format(mt=mt, cpg=cpg, gd=gd, d=gd * cpg)
        out.append(
            f'extern "C" __global__ void __launch_bounds__({maxt}, {minb}) '
            f"{_name(mt, gd, maxt, minb, body)}(const uint4* __restrict__ W, const uint2* __restrict__ SZ, "
            "const uint16_t* __restrict__ X, uint16_t* __restrict__ Y, const uint16_t* __restrict__ bias, "
            "const uint16_t* __restrict__ res, int M, int N, int K, int SN, int SK, int act, int flags) {"
            f" anvil_w4a16::{fn}(W, SZ, X, Y, bias, res, M, N, K, SN, SK, act, flags); }}"
        )
    return "\n".join(out) + "\n"


def build(out: Path) -> tuple[Path, str]:
    src = out / "probe.cu"
    src.write_text(source())
    cubin = out / "probe.cubin"
    cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", "-arch=sm_90", "-Xptxas", "-v", "-o", str(cubin), str(src)]
    r = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return cubin, r.stderr


def regs_of(ptxas: str) -> dict[str, int]:
    regs, cur = {}, None
    for line in ptxas.splitlines():
        if "Compiling entry function" in line:
            cur = line.split("'")[1]
        elif "registers" in line and cur:
            regs[cur] = int(line.split("Used ")[1].split(" registers")[0])
    return regs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--shapes", default="8192x8192")
    ap.add_argument("--ms", default="1,16")
    ap.add_argument("--cases", action="store_true", help="one launch per ncu case, no timing")
    args = ap.parse_args()

    import cupy as cp
    import torch

    from anvil_kernels import dequantize
    from anvil_kernels.cuda import W4A16Linear, prepack, prepack_mtc

    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="w4a16_probe_"))
    t0 = time.time()
    cubin, ptxas = build(tmp)
    regs = regs_of(ptxas)
    print(f"built {len(VARIANTS)} variants in {time.time() - t0:.1f} s; registers {regs}", flush=True)
    mod = cp.RawModule(path=str(cubin))
    rng = np.random.default_rng(7)
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = random_weight(k, n, rng)
        packed = prepack(w)
        if args.cases:
            _cases(w, packed | prepack_mtc(w), k, n)
            continue
        qws = [cp.asarray(packed["qweight"]) for _ in range(COPIES)]
        szs = [cp.asarray(packed["sz"]) for _ in range(COPIES)]
        wbytes = packed["qweight"].nbytes + packed["sz"].nbytes
        stream = _stream_us(_helpers_module(), wbytes, 60, 15)
        wbf = torch.from_numpy(dequantize(w)).cuda().to(torch.bfloat16)
        wbfs = [wbf.clone() for _ in range(COPIES)]
        del wbf
        ref_layer = W4A16Linear(load_default_module(), packed, 64, kernel="gemv")
        for m in (int(v) for v in args.ms.split(",")):
            res = _probe_m(mod, regs, ref_layer, qws, szs, wbfs, m, k, n, stream, rng)
            rows.append(res)
            print(f"K={k} N={n} M={m}: stream {stream:.2f} cuBLAS {res['cublas_us']:.2f} default "
                  f"{res['default_us']:.2f} best old {res['best_old']} best new {res['best_new']}",
                  flush=True)  # fmt: skip
            for p in sorted(res["probes"], key=lambda p: p["us"])[:12]:
                print("   ", p)
    if not args.cases:
        (out_dir / "w4a16_probe.json").write_text(json.dumps({"rows": rows, "regs": regs}, indent=1))


def _probe_m(mod: Any, regs: dict, ref_layer: Any, qws: list, szs: list, wbfs: list, m: int, k: int, n: int,
             stream: float, rng: np.random.Generator) -> dict[str, Any]:  # fmt: skip
    """Every (variant, sn, sk) at M = m against the default kernel's output and time."""
    import cupy as cp
    import torch

    from anvil_kernels.format import f32_to_bf16_bits

    xb = f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32))
    x = cp.asarray(xb)
    xt = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16).cuda()
    ref = cp.empty((m, n), cp.uint16)
    ref_layer(x, ref)
    ot = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    cub = _graph_torch(lambda i: torch.matmul(xt, wbfs[i % COPIES], out=ot), 60, 15)
    default_us = _graph_cupy(lambda i: ref_layer(x, ref), 60, 15)
    outs = [cp.empty((m, n), cp.uint16) for _ in range(COPIES)]
    res: dict[str, Any] = {"K": k, "N": n, "M": m, "stream_us": round(stream, 2), "cublas_us": round(cub, 2),
                           "default_us": round(default_us, 2), "default_plan": str(ref_layer.plan(m)),
                           "probes": []}  # fmt: skip
    for (mt, gd, maxt, minb), body in itertools.product(VARIANTS, BODIES):
        if 8 * mt < m and mt < 2:
            continue
        fn = mod.get_function(_name(mt, gd, maxt, minb, body))
        for sn in SNS:
            for sk in SKS:
                threads = 32 * sn * sk
                if threads > maxt or sk > k // GROUP:
                    continue
                grid = (-(-m // (8 * mt)), n // (16 * sn))
                smem = sk * sn * mt * 512
                a = (np.int32(m), np.int32(n), np.int32(k), np.int32(sn), np.int32(sk), np.int32(0),
                     np.int32(1 | (2 if grid[0] == 1 else 0)))  # fmt: skip

                def run(i: int, fn: Any = fn, grid: Any = grid, th: int = threads, sm: int = smem,
                        a: tuple = a) -> None:  # fmt: skip
                    fn(grid, (th,), (qws[i % COPIES], szs[i % COPIES], x, outs[i % COPIES],
                                     np.uint64(0), np.uint64(0), *a), shared_mem=sm)  # fmt: skip

                outs[0].fill(0xFFFF)
                run(0)
                same = bool(cp.all(outs[0] == ref))
                us = _graph_cupy(run, 60, 15) if same else float("nan")
                regs_used = regs.get(_name(mt, gd, maxt, minb, body))
                res["probes"].append({"body": body, "mt": mt, "gd": gd, "maxt": maxt, "minb": minb, "sn": sn,
                                      "sk": sk, "regs": regs_used, "us": round(us, 2),
                                      "same_as_default": same})  # fmt: skip
    for body in BODIES:
        res[f"best_{body}"] = min(
            (p for p in res["probes"] if p["same_as_default"] and p["body"] == body), key=lambda p: p["us"]
        )
    return res


_MODULE: Any = None


def load_default_module() -> Any:
    """The default GEMV variants and the tiles `--cases` profiles (bf16, g128; sm_90a: the wg tiles'
    wgmma), built once."""
    global _MODULE
    if _MODULE is None:
        from anvil_kernels.cuda import W4A16Params, build_fatbins, load_module

        mtc = ("mtc64", "mtc128w", "wg64", "wg128w", "wgs64n", "wgs128w")
        params = W4A16Params(dtypes=("bf16",), groups=(GROUP,), tc_configs=(), mtc_configs=mtc)
        _MODULE = load_module(build_fatbins(params, ("compute_90a,code=sm_90a",), jobs=4))
    return _MODULE


def _cases(w: Any, packed: dict, k: int, n: int) -> None:
    """One launch each: the streaming read, gemv M=1 and 16, mtc64, wg64 and wgs64n at M=64, mtc128w,
    wg128w and wgs128w at M=256 (under ncu: cold L2 per launch; a wgs case is two kernels, w4a16_tile_x
    and the tile)."""
    import cupy as cp

    from anvil_kernels.cuda import W4A16Linear
    from anvil_kernels.format import f32_to_bf16_bits

    mod = load_default_module()
    rng = np.random.default_rng(3)
    wbytes = packed["qweight"].nbytes + packed["sz"].nbytes  # the streaming read of the same bytes
    buf = cp.ones(wbytes // 4, dtype=cp.uint32)
    sink = cp.zeros(1, dtype=cp.uint32)
    _helpers_module().get_function("stream_read")((2112,), (512,), (buf, np.uint64(wbytes // 16), sink))
    cases = (("gemv", 1), ("gemv", 16), ("mtc64", 64), ("wg64", 64), ("wgs64n", 64))
    cases += (("mtc128w", 256), ("wg128w", 256), ("wgs128w", 256))
    for kernel, m in cases:
        layer = W4A16Linear(mod, packed, m, kernel=kernel)
        x = cp.asarray(f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32)))
        out = cp.empty((m, n), cp.uint16)
        layer(x, out)
        cp.cuda.Device().synchronize()
        print(f"case {kernel} M={m}: {layer.plan(m)}", flush=True)


if __name__ == "__main__":
    main()
