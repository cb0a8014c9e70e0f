"""Where the wgs tiles' time goes (issue #17): each wgs tile timed with one part of its work left out.

The wgs kernels (w4a16_wgs.cu) take a template argument AB of timing ablations, 0 in every kernel
the library builds. This script instantiates the others, whose outputs are wrong by design:

    AB & 1  no x copies past the ring's first ST chunks (no x traffic from L2 in the steady state)
    AB & 8  no weight or scale copies past them (no weight traffic from DRAM)
    AB & 2  no dequantization (the raw words go to the tensor cores)
    AB & 4  no wgmma (the warps still dequantize, fence, commit and wait)

and times each exactly like ``bench/kernels_gpu.py`` times the kernels (CUDA-graph replay, weights
rotated over 6 copies, cold L2), at the splits given, beside the unablated kernel (which must give
the library kernel's bits), ``w4a16_tile_x`` alone and cuBLAS bf16. The difference to the whole
kernel is what that part costs where the others still run.

Then the whole kernel once more with AB = 16 (WGS_AB_TRACE: nothing left out, a per-block timeline
stamped, w4a16_wgs.cu's wgs_stamp): timed the same way, and the last launch's timeline summarized
per phase over the blocks (barrier init, first chunk landed, the loop, the epilogue with split-K,
the producer's last copy; launch skew and the kernel's span from %globaltimer; blocks a SM); for a
tile whose splits sum in a cluster (kc), its epilogue in three parts (the wait for the cluster's
loops, the exchange through distributed shared memory, the sums and the stores).

    python3 bench/wgs_ablate.py --out DIR [--shapes 8192x8192] [--cases wgs64nd:64:1,2,4;wgs128w:256:1,2]
    python3 bench/wgs_ablate.py --ncu-case wgs64nd:64:2   # one launch of the library kernel, for ncu

Writes DIR/wgs_ablate.{json,md} (command, commit, GPU) and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from kernels_gpu import COPIES, GROUP, _graph_cupy, _graph_torch, random_weight
from w4a16_probe import regs_of

ABLATIONS = {0: "whole kernel", 1: "no x copies", 8: "no weight copies", 9: "no copies",
             2: "no dequantization", 4: "no wgmma", 6: "no dequantization, no wgmma",
             7: "no math, no x copies (weight copies only)", 14: "no math, no weight copies (x copies only)",
             15: "only the waits and shared loads"}  # fmt: skip
TRACE_AB = 16  # WGS_AB_TRACE
TRACE_BLOCKS = 4096  # ANVIL_WGS_TRACE: the most blocks a timeline holds (16 slots each)
TRACE_SLOTS = 16


def _abl_name(cfg: str, ab: int) -> str:
    return f"abl_{cfg}_ab{ab}"


def source(cfgs: list[str]) -> str:
    """The library's source with the bf16 g128 kernels of ``cfgs`` and an ablated twin per AB."""
    from anvil_kernels.cuda import MTC_CONFIGS, W4A16Params, w4a16_source

    # no GEMV-like variants: the layers are made with the tile forced, for every M
    params = W4A16Params(dtypes=("bf16",), groups=(GROUP,), tiles=(), tc_configs=(), mtc_configs=tuple(cfgs))
    out = [f"#define ANVIL_WGS_TRACE {TRACE_BLOCKS}", w4a16_source(params)]
    for cfg in cfgs:
        c = MTC_CONFIGS[cfg]
        if not c.ws or c.dq:
            raise ValueError(f"{cfg}: the ablations are the wgs kernel's (a ws config without dq)")
        # a tx tile's x tensor map: its last parameter, by value
        tmap_param, tmap_arg = (
            (", const __grid_constant__ anvil_w4a16::AnvilTmap tmx", ", &tmx") if c.tx else ("", "")
        )
        for ab in (*ABLATIONS, TRACE_AB):
            out.append(
                f'extern "C" __global__ void __launch_bounds__({32 * (c.wn + c.ws)}, {c.minb}) '
                f"ANVIL_WGS_KC_{c.kc} "
                f"{_abl_name(cfg, ab)}(const uint4* __restrict__ W, const uint4* __restrict__ SZ, "
                "const uint16_t* __restrict__ X, uint16_t* __restrict__ Y, "
                "const uint16_t* __restrict__ bias, "
                "const uint16_t* __restrict__ res, float* __restrict__ ws, int* __restrict__ counters, "
                f"int M, int N, int K, int act, int flags{tmap_param}) {{ anvil_w4a16::w4a16_wgs_body<0, "
                f"{c.mt}, {c.ns}, {c.wn}, {c.st}, {GROUP // 64}, {c.ws}, {ab}, {c.kc}, "
                f"{int(c.tx)}, {int(c.ur)}>"
                f"(W, SZ, X, Y, bias, res, ws, counters, M, N, K, act, flags{tmap_arg}); }}"
            )
    return "\n".join(out) + "\n"


def build(cfgs: list[str], out: Path) -> tuple[list[Path], dict[str, int]]:
    """One cubin per config (nvcc for sm_90a, the units in parallel); the registers ptxas reports
    per kernel. Raises on a ptxas warning (e.g. serialized wgmmas, which would time something else)."""
    procs: list[tuple[Path, Any]] = []
    for cfg in cfgs:
        src = out / f"ablate_{cfg}.cu"
        cubin = out / f"ablate_{cfg}.cubin"
        text = source([cfg])
        log = cubin.with_suffix(".ptxas")  # ptxas's report, kept beside the cubin
        if cubin.exists() and log.exists() and src.exists() and src.read_text() == text:  # built before
            procs.append((cubin, None))
            continue
        src.write_text(text)
        cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", "-lineinfo", "-arch=sm_90a", "-Xptxas", "-v", "-o",
               str(cubin), str(src)]  # fmt: skip
        procs.append(
            (cubin, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        )
    regs: dict[str, int] = {}
    for cubin, proc in procs:
        if proc is None:  # an earlier run's build: its registers from the report it kept
            regs |= regs_of(cubin.with_suffix(".ptxas").read_text())
            continue
        _, err = proc.communicate()
        if proc.returncode != 0 or "ptxas warning" in err.lower() or "C75" in err:
            raise RuntimeError(f"nvcc for {cubin.name}: rc {proc.returncode}\n{err[-4000:]}")
        cubin.with_suffix(".ptxas").write_text(err)
        regs |= regs_of(err)
    return [c for c, _ in procs], regs


def parse_cases(text: str) -> list[tuple[str, int, list[int]]]:
    """'cfg:M:s1,s2;...' -> [(cfg, M, [splits])]."""
    out = []
    for case in filter(None, text.split(";")):
        cfg, m, splits = case.split(":")
        out.append((cfg, int(m), [int(s) for s in splits.split(",")]))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--shapes", default="8192x8192")
    ap.add_argument("--cases", default="wgs64nd:64:1,2,4;wgs128w:256:1,2")
    ap.add_argument("--ncu-case", default="", help="cfg:M:split: one launch of the library kernel")
    ap.add_argument("--commit", default="unknown")
    ap.add_argument("--build-dir", default="", help="keep the cubins here and reuse them (same source)")
    args = ap.parse_args()

    import cupy as cp
    import torch

    from anvil_kernels import dequantize
    from anvil_kernels.cuda import W4A16Linear, prepack, prepack_mtc
    from anvil_kernels.cuda.w4a16_linear import ModuleSet
    from anvil_kernels.format import f32_to_bf16_bits

    cases = parse_cases(args.ncu_case or args.cases)
    cfgs = sorted({c for c, _, _ in cases})
    tmp = Path(args.build_dir or tempfile.mkdtemp(prefix="wgs_ablate_"))
    tmp.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    cubins, regs = build(cfgs, tmp)
    print(f"built in {time.time() - t0:.1f} s; registers {regs}", flush=True)
    mod = ModuleSet([cp.RawModule(path=str(c)) for c in cubins])
    rng = np.random.default_rng(11)
    rows: list[dict[str, Any]] = []
    for shape in args.shapes.split(","):
        k, n = (int(v) for v in shape.split("x"))
        w = random_weight(k, n, rng)
        packed = prepack(w) | prepack_mtc(w)

        def make_layers(cfg: str, m: int, split: int, copies: int, packed: dict = packed) -> list:
            # the tile forced from the start: the dispatcher's kernels for other M need not be built
            return [
                W4A16Linear(mod, packed, m, kernel=cfg, split=split, keep_host=True) for _ in range(copies)
            ]

        if args.ncu_case:
            cfg, m, splits = cases[0]
            layers = make_layers(cfg, m, splits[0], 1)
            x = cp.asarray(f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32)))
            layers[0](x, cp.empty((m, n), cp.uint16))
            cp.cuda.Device().synchronize()
            print(f"ncu case {cfg} M={m} split {splits[0]}: {layers[0].plan(m)}", flush=True)
            return
        wbf = torch.from_numpy(dequantize(w)).cuda().to(torch.bfloat16)
        wbfs = [wbf.clone() for _ in range(COPIES)]
        del wbf
        for cfg, m, splits in cases:
            layers = make_layers(cfg, m, splits[0], COPIES)
            rows += _time_case(mod, layers, wbfs, cfg, m, splits, k, n, rng)
            del layers
    meta = {"command": "python3 " + " ".join(sys.argv), "commit": args.commit,
            "device": torch.cuda.get_device_name(), "registers": regs, "copies": COPIES}  # fmt: skip
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "wgs_ablate.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    (out_dir / "wgs_ablate.md").write_text(_markdown(meta, rows))
    print(_markdown(meta, rows))


def _time_case(mod: Any, layers: list, wbfs: list, cfg: str, m: int, splits: list[int], k: int, n: int,
               rng: np.random.Generator) -> list[dict[str, Any]]:  # fmt: skip
    """Every ablation of cfg at M = m and each split, the tile_x launch alone and cuBLAS."""
    import cupy as cp
    import torch

    from anvil_kernels.cuda.w4a16_mtc import TILE_X_THREADS
    from anvil_kernels.format import f32_to_bf16_bits

    xb = f32_to_bf16_bits(rng.standard_normal((m, k)).astype(np.float32))
    x = cp.asarray(xb)
    xt = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16).cuda()
    ot = torch.empty((m, n), dtype=torch.bfloat16, device="cuda")
    r = 24
    cublas = _graph_torch(lambda i: torch.matmul(xt, wbfs[i % COPIES], out=ot), r, 15)
    outs = [cp.empty((m, n), cp.uint16) for _ in range(COPIES)]
    rows: list[dict[str, Any]] = []
    for split in splits:
        for layer in layers:
            layer.set_kernel(cfg, split)
        layers[0](x, outs[0])
        ref = outs[0].copy()
        base = [layer._make(m) for layer in layers]
        rows_x = base[0].xt_rows
        targs = (x, layers[0]._xt, np.int32(m), np.int32(rows_x), np.int32(k))
        tgrid = (-(-rows_x * (k // 8) // TILE_X_THREADS),)

        def run_tile(i: int, f: Any = layers[0]._tile_x, g: tuple = tgrid, a: tuple = targs) -> None:
            f(g, (TILE_X_THREADS,), a)

        tile_us = _graph_cupy(run_tile, r, 15) if rows_x else 0.0  # a tx tile: no tile_x launch
        for ab, what in ABLATIONS.items():
            _use_kernel(layers, base, m, mod.get_function(_abl_name(cfg, ab)))
            outs[0].fill(0xFFFF)
            layers[0](x, outs[0])
            same = bool(cp.all(outs[0] == ref))
            us = _graph_cupy(lambda i: layers[i % COPIES](x, outs[i % COPIES]), r, 15)
            rows.append({"K": k, "N": n, "M": m, "cfg": cfg, "split": split, "grid": list(base[0].plan.grid),
                         "ab": ab, "what": what, "us": round(us, 2), "tile_x_us": round(tile_us, 2),
                         "cublas_us": round(cublas, 2), "same_bits": same})  # fmt: skip
            print(rows[-1], flush=True)
        whole = next(row["us"] for row in rows if row["split"] == split and row["ab"] == 0)
        rows.append(_trace(mod, layers, base, x, outs, cfg, m, k, n, split, r, whole))
        print({key: v for key, v in rows[-1].items() if key != "trace"}, rows[-1]["trace"], flush=True)
        for layer, b in zip(layers, base, strict=True):
            layer._launches[m] = b
    return rows


def _trace(mod: Any, layers: list, base: list, x: Any, outs: list, cfg: str, m: int, k: int, n: int,
           split: int, r: int, whole_us: float) -> dict[str, Any]:  # fmt: skip
    """The whole kernel with its timeline (AB = TRACE_AB), timed as the ablations; the last
    launch's per-block phases (µs at the SM clock each block measured: its clock64 over
    %globaltimer between entry and end)."""
    import cupy as cp

    unit = mod.module_of(_abl_name(cfg, TRACE_AB))  # this config's cubin, with its own buffer
    _use_kernel(layers, base, m, unit.get_function(_abl_name(cfg, TRACE_AB)))
    ptr = unit.get_global("anvil_wgs_trace")
    buf = cp.ndarray((TRACE_BLOCKS, TRACE_SLOTS), dtype=cp.uint64, memptr=ptr)
    buf.fill(0)
    us = _graph_cupy(lambda i: layers[i % COPIES](x, outs[i % COPIES]), r, 15)
    cp.cuda.Device().synchronize()
    nb = int(np.prod(base[0].plan.grid))
    t = buf.get()[: min(nb, TRACE_BLOCKS)].astype(np.int64)
    gt0, c0, cinit, cfirst, cloop, cend, cprod, sm, gt1, cx1, cx2 = (t[:, i] for i in range(11))
    ghz = (cend - c0) / np.maximum(gt1 - gt0, 1)  # cycles a ns, per block

    def pct(d_us: np.ndarray) -> dict[str, float]:
        return {
            q: round(float(np.percentile(d_us, p)), 2) for q, p in (("p10", 10), ("p50", 50), ("p90", 90))
        }

    def phase(a: np.ndarray, b: np.ndarray) -> dict[str, float]:  # clock64 stamps a -> b
        return pct((b - a) / ghz / 1e3)

    per_sm = np.bincount(sm.astype(np.int64))
    trace = {
        "blocks": nb, "written": int((gt1 > 0).sum()), "clock_ghz_p50": round(float(np.median(ghz)), 3),
        "entry_after_first_us": pct((gt0 - gt0.min()) / 1e3),
        "span_us": round(float(gt1.max() - gt0.min()) / 1e3, 2),
        "init": phase(c0, cinit), "first_chunk": phase(cinit, cfirst), "loop": phase(cfirst, cloop),
        "epilogue": phase(cloop, cend), "producer_done": phase(cinit, cprod), "block": phase(c0, cend),
        "blocks_per_sm": {int(v): int((per_sm == v).sum()) for v in np.unique(per_sm[per_sm > 0])},
    }  # fmt: skip
    from anvil_kernels.cuda import MTC_CONFIGS

    if MTC_CONFIGS[cfg].kc:  # the epilogue of a cluster's split-K in its three parts
        trace["cluster"] = {"wait for the cluster's loops": phase(cloop, cx1), "exchange": phase(cx1, cx2),
                            "sums and stores": phase(cx2, cend)}  # fmt: skip
    return {"K": k, "N": n, "M": m, "cfg": cfg, "split": split, "grid": list(base[0].plan.grid),
            "ab": TRACE_AB, "what": "whole kernel, traced", "us": round(us, 2), "tile_x_us": None,
            "cublas_us": None, "same_bits": None, "trace": trace, "whole_us": whole_us}  # fmt: skip


def _use_kernel(layers: list, base: list, m: int, fn: Any) -> None:
    """Each layer's launch at M = m (``base``: the library kernel's) with kernel ``fn`` instead."""
    if base[0].plan.smem > 48 * 1024:
        fn.max_dynamic_shared_size_bytes = base[0].plan.smem
    for layer, b in zip(layers, base, strict=True):
        layer._launches[m] = dataclasses.replace(b, fn=fn)


def _markdown(meta: dict, rows: list[dict]) -> str:
    out = [f"# wgs tiles with parts of their work left out ({meta['device']})", "",
           f"Command: `{meta['command']}` · commit {meta['commit']} · µs per launch (w4a16_tile_x + "
           f"the tile), CUDA-graph replay, weights over {meta['copies']} copies; registers "
           f"{meta['registers']}", "",
           "| K x N | M | tile / split (grid) | what is left out | µs | whole - this | tile_x alone "
           "| cuBLAS bf16 |", "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    whole = {(r["K"], r["N"], r["M"], r["cfg"], r["split"]): r["us"] for r in rows if r["ab"] == 0}
    traced = [r for r in rows if r["ab"] == TRACE_AB]
    for r in (r for r in rows if r["ab"] != TRACE_AB):
        w = whole[(r["K"], r["N"], r["M"], r["cfg"], r["split"])]
        bits = "" if r["ab"] else (" (bits as the library's)" if r["same_bits"] else " (**bits differ**)")
        out.append(f"| {r['K']} x {r['N']} | {r['M']} | {r['cfg']} / {r['split']} ({r['grid']}) | "
                   f"{r['what']}{bits} | {r['us']} | {w - r['us']:.2f} | {r['tile_x_us']} | "
                   f"{r['cublas_us']} |")  # fmt: skip
    if traced:
        out += ["", "Timeline of the whole kernel (AB 16, the last launch of a replay; µs p10 / p50 / p90 "
                "over the blocks, at each block's measured SM clock):", "",
                "| tile / split | µs traced (untraced) | clock GHz | span | entry after the first | init | "
                "first chunk landed | loop | epilogue | producer done | block | blocks a SM |",
                "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
        for r in traced:
            t = r["trace"]
            out.append(f"| {r['cfg']} / {r['split']} | {r['us']} ({r['whole_us']}) | {t['clock_ghz_p50']} | "
                       f"{t['span_us']} | {_pcts(t['entry_after_first_us'])} | {_pcts(t['init'])} | "
                       f"{_pcts(t['first_chunk'])} | {_pcts(t['loop'])} | {_pcts(t['epilogue'])} | "
                       f"{_pcts(t['producer_done'])} | {_pcts(t['block'])} | "
                       f"{t['blocks_per_sm']} |")  # fmt: skip
        clustered = [r for r in traced if "cluster" in r["trace"]]
        if clustered:
            out += ["", "The epilogue of a cluster's split-K (µs p10 / p50 / p90):", "",
                    "| tile / split | wait for the cluster's loops | exchange | sums and stores |",
                    "|---|---|---|---|"]  # fmt: skip
            for r in clustered:
                parts = " | ".join(_pcts(v) for v in r["trace"]["cluster"].values())
                out.append(f"| {r['cfg']} / {r['split']} | {parts} |")
    return "\n".join(out) + "\n"


def _pcts(d: dict) -> str:
    return f"{d['p10']} / {d['p50']} / {d['p90']}"


if __name__ == "__main__":
    main()
