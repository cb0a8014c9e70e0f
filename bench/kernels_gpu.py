"""GPU benchmark of W4A16 (g128, bf16 activations) against its peers and the harness's own floor.

For each (K, N) and M, in one run, timed the same way: Anvil's GEMV-like kernel (its register ring,
``w4a16.cu``, and up to M = GV_MAX_M its shared-memory ring configs ``GV_CONFIGS``, ``w4a16_gv.cu``),
the Marlin-like "mtc" tiles (``w4a16_mtc.cu``) and the older "tc" tiles (``w4a16_tc.cu``, from
M = 32 on, where they were measured; at smaller M the GEMV-like kernel beat them by 1.5x), each at its planned
split, then a split sweep of the best tile; the dispatcher's choice (what ``W4A16Linear`` runs by
default), cuBLAS bf16 (torch.matmul on the dequantized weights), PyTorch's
INT4 tinygemm (``_weight_int4pack_mm``, same quantized weights), a tuned streaming read of the same
weight bytes (16-byte ``ld.global.cs`` loads, 2,112 blocks of 512 threads: what any kernel that
reads those bytes can reach in this harness) and an empty kernel.

Cold L2: every method's weights are rotated over COPIES copies (6 x 34 MB > the 60 MB L2; the
MiniLM shapes' weights, 0.3 MB, stay in L2 for every method alike). Times are medians per launch of
CUDA-graph replays of R launches (CUDA events). Writes kernels_gpu.json, kernels_gpu.md and
w4a16_dispatch.json (the measured dispatch table, ``DispatchTable.load``: per shape and M the
fastest INT4 kernel whose error passed, and ``bf16_faster`` where cuBLAS beat it) to --out.

On the H200 (bench/w4a16_device.sh runs it):
    PYTHONPATH=libs/kernels/src python3 bench/kernels_gpu.py --fatbin F --out $OUT
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

SHAPES = [(8192, 8192), (4096, 14336), (14336, 4096)]
MS = [1, 4, 16, 32, 64, 128, 256]
# the MiniLM/BERT linears the executor runs (K x N: QKV, FFN in, FFN out) and their batch rows
MINILM_SHAPES = [(384, 1152), (384, 1536), (1536, 384)]
MINILM_MS = [16, 128, 512, 2048]
COPIES = 6
GROUP = 128
SPLITS = (1, 2, 4, 8, 16, 32)
GV_MAX_M = 32  # the gv configs (one strip per warp, 8- or 16-row tiles) are timed up to this M
ERR_OK = 1e-2  # relative error bound of a bf16 output (gpu_check.DT_TOL); a kernel above it never wins

_STREAM_SRC = r"""
template <bool PDL>
__device__ void stream_body(const uint4* __restrict__ p, size_t n16, unsigned* out) {
    if (PDL) {  // launched as a dependent: scheduled early, it waits for the kernel before it and only
        // then reads, as any kernel whose input the previous one writes must
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        asm volatile("griddepcontrol.wait;" ::: "memory");
    }
    unsigned acc = 0;
    const size_t step = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += step) {
        uint4 v;
        asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p + i));
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x9E3779B9u) out[0] = acc;  // keeps the loads; practically never true
}
extern "C" __global__ void stream_read(const uint4* __restrict__ p, size_t n16, unsigned* out) {
    stream_body<false>(p, n16, out);
}
extern "C" __global__ void stream_read_pdl(const uint4* __restrict__ p, size_t n16, unsigned* out) {
    stream_body<true>(p, n16, out);
}
extern "C" __global__ void empty_kernel() {}
"""


def _graph_cupy(fn: Callable[[int], None], r: int, reps: int) -> float:
    """Median us per launch over reps replays of a graph of r launches fn(0..r-1)."""
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    with s:
        for i in range(r):
            fn(i)
        s.synchronize()
        s.begin_capture()
        for i in range(r):
            fn(i)
        g = s.end_capture()
        g.upload(s)
        g.launch(s)
        s.synchronize()
        times = []
        for _ in range(reps):
            e0.record(s)
            g.launch(s)
            e1.record(s)
            e1.synchronize()
            times.append(cp.cuda.get_elapsed_time(e0, e1) * 1e3 / r)
    return statistics.median(times)


def _graph_torch(fn: Callable[[int], None], r: int, reps: int) -> float:
    import torch

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(r):
            fn(i)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(r):
            fn(i)
    g.replay()
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3 / r)
    return statistics.median(times)


def _helpers_module(nvcc: str = "nvcc") -> Any:
    import cupy as cp

    d = Path(tempfile.mkdtemp(prefix="anvil_bench_"))
    (d / "h.cu").write_text(_STREAM_SRC)
    cmd = [nvcc, "--cubin", "-O3", "-arch=sm_90", "-o", str(d / "h.cubin"), str(d / "h.cu")]
    subprocess.run(cmd, check=True, capture_output=True)
    return cp.RawModule(path=str(d / "h.cubin"))


def _stream_us(helpers: Any, nbytes: int, r: int, reps: int, pdl: bool = False) -> float:
    """The streaming read of nbytes over COPIES buffers; ``pdl``: each launch a programmatic
    dependent of the one before (stream_read_pdl, which waits for it before reading)."""
    import cupy as cp

    from anvil_kernels.cuda.pdl import PdlLauncher

    n16 = nbytes // 16
    bufs = [cp.ones(n16 * 4, dtype=cp.uint32) for _ in range(COPIES)]
    sink = cp.zeros(1, dtype=cp.uint32)
    fn = helpers.get_function("stream_read_pdl" if pdl else "stream_read")
    launch = PdlLauncher() if pdl else None

    def run(i: int) -> None:
        args = (bufs[i % COPIES], np.uint64(n16), sink)
        if launch is not None:
            launch(fn, (2112,), (512,), args)
        else:
            fn((2112,), (512,), args)

    return _graph_cupy(run, r, reps)


def _empty_us(helpers: Any) -> float:
    fn = helpers.get_function("empty_kernel")
    return _graph_cupy(lambda i: fn((1,), (32,), ()), 60, 15)


def _cublas(x: Any, ws: list, out: Any, i: int) -> None:
    import torch

    torch.matmul(x, ws[i % COPIES], out=out)


def _tinygemm(x: Any, packed: list, szs: list, i: int) -> None:
    import torch

    torch.ops.aten._weight_int4pack_mm(x, packed[i % COPIES], GROUP, szs[i % COPIES])


def _configs_for(m: int, excluded: frozenset[str] = frozenset()) -> tuple[list[str], list[str]]:
    """(mtc, tc) tile configs measured at M = m: mtc tiles no taller than max(16, 2M) rows (taller
    ones only multiply zero rows), the older tc tiles from M = 32 on; none of ``excluded``
    (--exclude-configs: e.g. tiles that failed their test)."""
    from anvil_kernels.cuda import MTC_CONFIGS, TC_CONFIGS

    mtc = [c for c, cfg in MTC_CONFIGS.items() if cfg.bm <= max(16, 2 * m) and c not in excluded]
    tc = [c for c in TC_CONFIGS if c not in excluded] if m >= 32 else []
    return mtc, tc


def _gv_configs_for(m: int, excluded: frozenset[str] = frozenset()) -> list[str]:
    """The GEMV-like shared-memory ring configs timed at M = m (up to GV_MAX_M), none of ``excluded``."""
    from anvil_kernels.cuda import GV_CONFIGS

    return [c for c in GV_CONFIGS if c not in excluded] if m <= GV_MAX_M else []


def random_weight(k: int, n: int, rng: np.random.Generator) -> Any:
    """An Int4Weight (K, N) of random nibbles, g = GROUP, bf16 scales in [0.002, 0.02] and integer
    zero points 0..15: the weights every W4A16 bench here times."""
    from anvil_kernels import Int4Weight
    from anvil_kernels.format import f32_to_bf16_bits, pack_nibbles

    q = rng.integers(0, 16, size=(k, n), dtype=np.uint8)
    s = f32_to_bf16_bits(rng.uniform(0.002, 0.02, size=(k // GROUP, n)).astype(np.float32))
    z = f32_to_bf16_bits(rng.integers(0, 16, size=(k // GROUP, n)).astype(np.float32))
    return Int4Weight(pack_nibbles(q), s, z, GROUP, k, n, "bf16")


def bench_shape(
    k: int,
    n: int,
    ms: list[int],
    module: Any,
    helpers: Any,
    rng: np.random.Generator,
    excluded: frozenset[str] = frozenset(),
    swept: tuple[str, ...] = (),
) -> list[dict]:
    """Every method at every M for one (K, N); returns the table rows. Splits are swept for the best
    tile at its planned split, and for every tile of ``swept`` (--sweep-configs) that runs at M;
    the fastest of those sweeps is the best tile."""
    import cupy as cp
    import torch

    from anvil_kernels import dequantize, to_tinygemm
    from anvil_kernels.cuda import MTC_CONFIGS, W4A16Linear, prepack, prepack_mtc
    from anvil_kernels.format import bf16_bits_to_f32, f32_to_bf16_bits

    g = GROUP
    w = random_weight(k, n, rng)
    packed = prepack(w) | prepack_mtc(w)  # both layouts: every kernel can run
    wdeq = torch.from_numpy(dequantize(w)).cuda()  # float32 (K, N), exact

    def make_layers(m_max: int) -> list[W4A16Linear]:
        layers = [W4A16Linear(module, packed, m_max, keep_host=True) for _ in range(COPIES)]
        for layer in layers:  # upload both layouts now, outside the timed region
            layer.set_kernel("gemv")
            layer.set_kernel("mtc8")
            layer.set_kernel(None)
        return layers

    # one set of layers up to the largest M, or (small weights, large M: set_kernel plans every
    # M up to m_max) a set per M
    per_m = k * n < (1 << 24)
    all_layers = None if per_m else make_layers(max(ms))
    wbf = [wdeq.to(torch.bfloat16).contiguous() for _ in range(COPIES)]
    tg_packed: list = []
    tg_szs: list = []
    try:
        tg = to_tinygemm(w, "bf16")
        tg_w = torch.from_numpy(tg.weight).cuda()
        tg_sz = torch.from_numpy(tg.scales_and_zeros.view(np.int16)).view(torch.bfloat16).cuda()
        tg_packed = [torch.ops.aten._convert_weight_to_int4pack(tg_w, 8) for _ in range(COPIES)]
        tg_szs = [tg_sz.clone() for _ in range(COPIES)]
    except Exception as exc:  # a shape or torch build tinygemm does not take must not end the run
        print(f"tinygemm setup failed for {k}x{n}: {exc!r}")
    wbytes = packed["qweight"].nbytes + packed["sz"].nbytes
    stream = _stream_us(helpers, wbytes, 60, 15)
    stream_pdl = _stream_us(helpers, wbytes, 60, 15, pdl=True)
    rows = []
    for m in ms:
        layers = make_layers(m) if all_layers is None else all_layers
        xbits = f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32))
        x_cp = cp.asarray(xbits)
        x_t = torch.from_numpy(xbits.view(np.int16)).view(torch.bfloat16).cuda()
        ref = torch.from_numpy(bf16_bits_to_f32(xbits)).cuda() @ wdeq
        refn = float(torch.linalg.norm(ref))
        outs = [cp.full((m, n), 0xFFFF, dtype=cp.uint16) for _ in range(COPIES)]
        r = 60 if m <= 16 else 24 if m <= 256 else 12

        def relerr(o: torch.Tensor, ref: torch.Tensor = ref, refn: float = refn) -> float:
            return (
                float(torch.linalg.norm(o.float() - ref)) / refn
                if bool(torch.isfinite(o).all())
                else float("nan")
            )

        def anvil(
            kernel: str | None,
            split: int | None,
            r: int = r,
            x_cp: Any = x_cp,
            outs: list = outs,
            layers: list = layers,
            pdl: bool = False,
            late: bool | None = None,
        ) -> tuple[float, float]:
            for layer in layers:
                layer.set_kernel(kernel, split)
                layer.pdl = pdl  # the GEMV-like kernels as programmatic dependent launches
                layer.late_trigger = late  # a wgs tile's producer triggers after its wait
            try:
                outs[0].fill(0xFFFF)
                layers[0](x_cp, outs[0])
                got = torch.from_numpy(bf16_bits_to_f32(cp.asnumpy(outs[0]))).cuda()
                t = _graph_cupy(lambda i: layers[i % COPIES](x_cp, outs[i % COPIES]), r, 15)
            finally:
                for layer in layers:
                    layer.pdl = False
                    layer.late_trigger = None  # W4A16Linear's default (late for the tx tiles)
            return t, relerr(got)

        def ok(us: float, err: float) -> float:  # NaN errors (unwritten outputs) fail too
            return us if err <= ERR_OK else float("inf")

        res: dict[str, Any] = {"K": k, "N": n, "M": m, "stream_us": round(stream, 2)}
        if m <= 128:
            res["gemv_us"], res["gemv_err"] = anvil("gemv", None)
        else:  # measured 1.2-4x slower than the tiles there (bench/results/kernels_gpu.md)
            res["gemv_us"], res["gemv_err"] = float("nan"), float("nan")
        # the GEMV-like family: the register ring ("gemv") and the shared-memory ring configs
        gemv_like = {"gemv": ok(res["gemv_us"], res["gemv_err"]) if m <= 128 else float("inf")}
        res["gv"] = {}
        for cfg in _gv_configs_for(m, excluded):
            t, e = anvil(cfg, None)
            res["gv"][cfg] = {"us": round(t, 2), "err": e}
            gemv_like[cfg] = ok(t, e)
        gemv_best = min(gemv_like, key=lambda c_: gemv_like[c_])
        res["gemv_best"] = {"cfg": gemv_best, "us": round(gemv_like[gemv_best], 2)}
        # the same GEMV-like kernels launched as programmatic dependents (W4A16Linear(pdl=True)): a
        # launch streams its first weights while the one before it drains, and waits before it reads
        # x. Reported beside the plain launches; the dispatch table is made from the plain ones.
        res["stream_pdl_us"] = round(stream_pdl, 2)
        res["pdl"] = {}
        if m <= GV_MAX_M:
            for cfg in dict.fromkeys(("gemv", gemv_best)):
                t, e = anvil(cfg, None, pdl=True)
                res["pdl"][cfg] = {"us": round(t, 2), "err": e}
        pdl_ok = {c_: ok(v["us"], v["err"]) for c_, v in res["pdl"].items()}
        if pdl_ok:
            pb = min(pdl_ok, key=lambda c_: pdl_ok[c_])
            res["gemv_best_pdl"] = {"cfg": pb, "us": round(pdl_ok[pb], 2)}
        mtc_cfgs, tc_cfgs = _configs_for(m, excluded)
        tiles: dict[str, dict[str, Any]] = {}
        for cfg in mtc_cfgs + tc_cfgs:
            t, e = anvil(cfg, None)
            tiles[cfg] = {"us": round(t, 2), "err": e, "split": getattr(layers[0].plan(m), "split", None)}

        def split_sweep(cfg: str, planned: dict[str, Any]) -> dict[Any, float]:
            """`cfg` at its planned split (``planned``, timed above) and at every other split K allows, µs."""
            sw = {planned["split"]: planned["us"]}
            kc = MTC_CONFIGS[cfg].kc if cfg in MTC_CONFIGS else 0  # a cluster's split-K: that split only
            for sp in SPLITS:
                if sp <= k // g and sp not in sw and kc in (0, sp):
                    sw[sp] = round(anvil(cfg, sp)[0], 2)
            return sw

        # splits swept for the best tile at its planned split and for the tiles named by
        # --sweep-configs (an A/B of two tiles is then at each one's best split, not at the
        # planner's); the fastest sweep of a tile within the error bound is the best tile
        first = min(tiles, key=lambda c_: ok(tiles[c_]["us"], tiles[c_]["err"]))
        res["sweeps"] = {first: split_sweep(first, tiles[first])}
        for cfg in swept:
            if cfg in tiles and cfg not in res["sweeps"]:
                res["sweeps"][cfg] = split_sweep(cfg, tiles[cfg])
        best_cfg = min(res["sweeps"], key=lambda c_: ok(min(res["sweeps"][c_].values()), tiles[c_]["err"]))
        sweep = res["sweeps"][best_cfg]
        best_split = min(sweep, key=lambda s_: sweep[s_])
        # a wgs best tile also as programmatic dependents (w4a16_tile_x, none before a tx tile, and
        # the tile wait for the kernel before them, the tile's producer after copying its first
        # weights): beside the plain launches, never in the table
        if best_cfg in MTC_CONFIGS and MTC_CONFIGS[best_cfg].ws:
            t, e = anvil(best_cfg, best_split, pdl=True, late=False)
            res["tile_pdl"] = {"cfg": best_cfg, "split": best_split, "us": round(t, 2), "err": e}
            # the same with the producer letting the next launch be scheduled after its wait
            # (W4A16Linear.late_trigger): at most two launches in flight
            t, e = anvil(best_cfg, best_split, pdl=True, late=True)
            res["tile_pdl_late"] = {"cfg": best_cfg, "split": best_split, "us": round(t, 2), "err": e}
        res["mtc"] = {c_: v for c_, v in tiles.items() if c_ in mtc_cfgs}
        res["tc"] = {c_: v for c_, v in tiles.items() if c_ in tc_cfgs}
        res["tc_best"] = {"cfg": best_cfg, "split": best_split, "us": sweep[best_split], "splits": sweep}
        for fam, cfgs in (("mtc_best", mtc_cfgs), ("tc_old_best", tc_cfgs)):
            if cfgs:
                bc = min(cfgs, key=lambda c_: ok(tiles[c_]["us"], tiles[c_]["err"]))
                res[fam] = {"cfg": bc, "us": tiles[bc]["us"], "split": tiles[bc]["split"]}
        res["dispatch_us"], res["dispatch_err"] = anvil(None, None)
        res["dispatch_choice"] = layers[0].choice(m).as_dict()
        o_t = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        res["cublas_us"] = _graph_torch(functools.partial(_cublas, x_t, wbf, o_t), r, 15)
        res["cublas_err"] = relerr(o_t)
        try:
            if not tg_packed:
                raise RuntimeError("no tinygemm weights")
            y = torch.ops.aten._weight_int4pack_mm(x_t, tg_packed[0], g, tg_szs[0])
            res["tinygemm_err"] = relerr(y)
            res["tinygemm_us"] = _graph_torch(functools.partial(_tinygemm, x_t, tg_packed, tg_szs), r, 15)
        except Exception as exc:  # an op missing from this torch build must not end the run
            print(f"tinygemm failed: {exc!r}")
            res["tinygemm_us"], res["tinygemm_err"] = float("nan"), float("nan")
        # a kernel whose output failed the error bound is never the measured best
        tc_us = ok(sweep[best_split], tiles[best_cfg]["err"])
        gemv_us = gemv_like[gemv_best]
        best_int4 = min(gemv_us, tc_us)
        res["best_int4_us"] = best_int4  # inf: no INT4 kernel passed (no table entry then)
        res["best_kernel"] = gemv_best if gemv_us <= tc_us else best_cfg
        res["bf16_faster"] = res["cublas_us"] < best_int4
        for key in ("gemv_us", "dispatch_us", "cublas_us", "tinygemm_us"):
            res[key] = round(res[key], 2)
        rows.append(res)
        mb = res.get("mtc_best", {})
        pb_ = res.get("gemv_best_pdl", {})
        print(
            f"K={k:6d} N={n:6d} M={m:4d} stream {stream:7.2f} (PDL {stream_pdl:7.2f}) | "
            f"gemv {res['gemv_us']:8.2f} | "
            f"gemv-like best {gemv_best} {res['gemv_best']['us']} (PDL {pb_.get('cfg')} {pb_.get('us')}) | "
            f"mtc {mb.get('cfg')}/s{mb.get('split')} {mb.get('us')} | best tile {best_cfg}/s{best_split} "
            f"{sweep[best_split]:8.2f} (PDL {res.get('tile_pdl', {}).get('us')}, "
            f"late {res.get('tile_pdl_late', {}).get('us')}) | "
            f"dispatch {res['dispatch_us']:8.2f} "
            f"({res['dispatch_choice']['kernel']}) | cuBLAS {res['cublas_us']:8.2f} | tinygemm "
            f"{res['tinygemm_us']:8.2f} | err best {tiles[best_cfg]['err']:.1e}",
            flush=True,
        )
    return rows


def _markdown(meta: dict, rows: list[dict]) -> str:
    lines = [
        "# W4A16 GPU benchmark (bench/kernels_gpu.py)",
        "",
        f"{meta['device']}, {meta['sms']} SMs; commit {meta['commit']}; torch {meta['torch']}, cupy "
        f"{meta['cupy']}; g{GROUP}, bf16 activations, weights rotated over {COPIES} copies; median us per "
        f"launch of CUDA-graph replays; empty kernel {meta['empty_us']} us. Command: `{meta['command']}`",
        "",
        "stream = a tuned streaming read of the same weight bytes (the floor of this harness). mtc = best "
        "Marlin-like tile at its planned split; tc (old) = best older tile (measured from M = 32); best = "
        "best tile after the split sweep; dispatch = what W4A16Linear runs by default (the rule: the "
        "measured table is written next to this file). gv best = the fastest GEMV-like kernel (gemv's "
        "register ring or a shared-memory ring config of w4a16_gv.cu, timed up to M = "
        f"{GV_MAX_M}). `-`: not measured. PDL = each launch a programmatic dependent of the one before "
        "(W4A16Linear(pdl=True)): the GEMV-like kernel streams its first weights, then waits for the "
        "previous kernel before it reads x; stream (PDL) = the streaming read launched so, waiting before "
        "it reads; best tile, PDL = a wgs best tile so (w4a16_tile_x, none before a tx tile, and the "
        "tile wait; the tile's producer copies its first weights before, and lets the next launch be "
        "scheduled before its wait); PDL late = the same with that after its wait "
        "(W4A16Linear.late_trigger). The dispatch table and best INT4 come from the plain launches.",
        "",
        "| K x N | M | stream | stream (PDL) | gemv | gv best (cfg) | gv best, PDL (cfg) | mtc (cfg/split) | "
        "tc old (cfg/split) | best tile (cfg/split) | best tile, PDL | best tile, PDL late | dispatch "
        "(kernel) | cuBLAS bf16 | tinygemm | best INT4 / cuBLAS | best INT4 / stream | PDL / stream | "
        "rel err best |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]

    def cell(d: dict | None) -> str:
        return "-" if not d else f"{d['us']} ({d['cfg']}/{d['split']})"

    for r in rows:
        tb = r["tc_best"]
        best = r["best_int4_us"]
        err = (r["tc"] | r["mtc"]).get(tb["cfg"], {}).get("err", float("nan"))
        gb = r.get("gemv_best")
        gvb = "-" if not gb or gb["cfg"] == "gemv" else f"{gb['us']} ({gb['cfg']})"
        pb = r.get("gemv_best_pdl")
        pdl = "-" if not pb else f"{pb['us']} ({pb['cfg']})"
        pdl_ratio = "-" if not pb else f"{pb['us'] / r['stream_us']:.2f}"
        lines.append(
            f"| {r['K']} x {r['N']} | {r['M']} | {r['stream_us']} | {r.get('stream_pdl_us', '-')} | "
            f"{r['gemv_us']} | {gvb} | {pdl} | "
            f"{cell(r.get('mtc_best'))} | {cell(r.get('tc_old_best'))} | {cell(tb)} | "
            f"{r.get('tile_pdl', {}).get('us', '-')} | {r.get('tile_pdl_late', {}).get('us', '-')} | "
            f"{r['dispatch_us']} "
            f"({r['dispatch_choice']['kernel']}) | {r['cublas_us']} | {r['tinygemm_us']} | "
            f"{best / r['cublas_us']:.2f} | {best / r['stream_us']:.2f} | {pdl_ratio} | {err:.1e} |"
        )
    swept = [r for r in rows if len(r.get("sweeps", {})) > 1]
    if swept:  # --sweep-configs: each named tile at every split (µs), its best in bold
        lines += ["", "Split sweeps (µs per launch by split-K factor; the best of each tile in bold):", ""]
        for r in swept:
            for cfg, sw in r["sweeps"].items():
                top = min(sw, key=lambda s_: sw[s_])
                cells = ", ".join(
                    f"**{sp}: {us}**" if sp == top else f"{sp}: {us}"
                    for sp, us in sorted(sw.items(), key=lambda kv: int(kv[0]))
                )
                lines.append(f"- {r['K']} x {r['N']}, M = {r['M']}, {cfg}: {cells}")
    return "\n".join(lines) + "\n"


def _write(out_dir: Path, meta: dict, rows: list[dict], arch: str) -> None:
    from anvil_kernels.cuda.w4a16_dispatch import GEMV_LIKE

    (out_dir / "kernels_gpu.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    entries = [
        {
            "K": r["K"],
            "N": r["N"],
            "M": r["M"],
            "kernel": r["best_kernel"],
            "split": None if r["best_kernel"] in GEMV_LIKE else r["tc_best"]["split"],
            "bf16_faster": r["bf16_faster"],
        }
        for r in rows
        if r["best_int4_us"] != float("inf")
    ]
    table = {"arch": arch, "device": meta["device"], "commit": meta["commit"], "entries": entries}
    (out_dir / "w4a16_dispatch.json").write_text(json.dumps(table, indent=1))
    (out_dir / "kernels_gpu.md").write_text(_markdown(meta, rows))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--fatbin", default=None, help="prebuilt fatbin(s), os.pathsep-separated (default: build bf16 g128)"
    )
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--shapes", default=None, help="e.g. 8192x8192,4096x14336")
    ap.add_argument("--ms", default=None, help="e.g. 1,16,64")
    ap.add_argument("--no-minilm", action="store_true", help="skip the MiniLM shapes")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument(
        "--exclude-configs", default="", help="mtc/wg/tc tiles or gv configs not to launch, e.g. wg64,gvb16"
    )
    ap.add_argument(
        "--sweep-configs", default="", help="tiles whose splits are all timed too, e.g. wgs64nd,wgs64nq"
    )
    args = ap.parse_args()
    excluded = frozenset(c for c in args.exclude_configs.split(",") if c)
    swept = tuple(c for c in args.sweep_configs.split(",") if c and c not in excluded)

    import cupy as cp
    import torch

    from anvil_kernels.cuda import GV_CONFIGS, MTC_CONFIGS, W4A16Params, build_fatbins, load_module

    torch.backends.cuda.matmul.allow_tf32 = False
    shapes = SHAPES
    if args.shapes:
        shapes = [(int(a), int(b)) for a, b in (sh.split("x") for sh in args.shapes.split(","))]
    ms = MS if not args.ms else [int(v) for v in args.ms.split(",")]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    params = W4A16Params(
        dtypes=("bf16",), groups=(GROUP,), mtc_configs=tuple(MTC_CONFIGS), gv_configs=tuple(GV_CONFIGS)
    )
    module = load_module(args.fatbin or build_fatbins(params, ("compute_90a,code=sm_90a",)))
    helpers = _helpers_module()
    dev = torch.cuda.get_device_properties(0)
    rng = np.random.default_rng(1234)
    rows: list[dict] = []
    meta: dict[str, Any] = {
        "device": dev.name,
        "sms": dev.multi_processor_count,
        "commit": args.commit,
        "torch": torch.__version__,
        "cupy": cp.__version__,
        "copies": COPIES,
        "group": GROUP,
        "empty_us": round(_empty_us(helpers), 2),
        "command": "python3 bench/kernels_gpu.py "
        + " ".join(f"--{k_} {v}" for k_, v in vars(args).items() if v),
    }
    todo = [(k, n, ms) for k, n in shapes]
    if not args.no_minilm and not args.shapes:
        todo += [(k, n, MINILM_MS) for k, n in MINILM_SHAPES]
    for k, n, shape_ms in todo:
        rows += bench_shape(k, n, shape_ms, module, helpers, rng, excluded, swept)
        torch.cuda.empty_cache()
        cp.get_default_memory_pool().free_all_blocks()
        meta["wall_s"] = round(time.time() - t0, 1)
        # after each shape, so that a run cut short keeps its rows
        _write(out_dir, meta, rows, f"sm_{dev.major}{dev.minor}")
    print(_markdown(meta, rows))


if __name__ == "__main__":
    main()
