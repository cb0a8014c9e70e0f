"""Does the wgs consumer's dequantization overlap with wgmma? (issue #17; kernel: wgmma_overlap.cu)

The wgs tiles' ablations put their consumer loop at about the sum of its instruction issue and its
tensor-core time. This times, on one block a SM, the consumer's chunk shape with the
dequantization alone, the wgmmas alone (A from registers, "RS", as the wgs tiles; or from shared
memory, "SS") and both, for 1, 2 and 4 warpgroups a SM and once or twice the dequantization work,
in SM cycles a chunk (clock64 around the loop, the median over the blocks). "overlap" is how much
of the shorter part the combined run hides: (alu + mma - both) / min(alu, mma), 1 = fully hidden,
0 = none.

    python3 bench/wgmma_overlap.py --out DIR [--commit C]

Needs nvcc (sm_90a) and cupy on a Hopper GPU. Writes DIR/wgmma_overlap.{json,md} (command, commit,
GPU) and prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ITER = 512  # wgmma_overlap.cu's loop
SETS = [(1, 1), (2, 1), (4, 1), (2, 2), (4, 2)]  # (warpgroups a SM, dequantization repeats): WO_SET
# (what, MODE, SS, PP): the dequantization alone, the wgmmas alone (A from registers, from shared
# memory) and both (A from registers; from shared memory; through shared memory the warpgroup wrote)
KERNELS = [("alu", 1, 0, 0), ("mma_rs", 2, 0, 0), ("both_rs", 3, 0, 0), ("mma_ss", 2, 1, 0),
           ("both_ss", 3, 1, 0), ("both_sw", 3, 2, 0)]  # fmt: skip
# two warpgroups taking turns at the wgmma issue (ping-pong), as built: (repeats, SS)
PINGPONG = {(1, 0): "both_rs_pp", (1, 2): "both_sw_pp", (2, 0): "both_rs_pp"}
# the combined runs and the wgmma-alone run each is compared with
OVERLAPS = {"rs": ("both_rs", "mma_rs"), "ss": ("both_ss", "mma_ss"), "sw": ("both_sw", "mma_ss"),
            "rs_pp": ("both_rs_pp", "mma_rs"), "sw_pp": ("both_sw_pp", "mma_ss")}  # fmt: skip


def build(out: Path) -> Path:
    src = Path(__file__).with_name("wgmma_overlap.cu")
    cubin = out / "wgmma_overlap.cubin"
    cmd = ["nvcc", "--cubin", "-O3", "-std=c++17", "-arch=sm_90a", "-Xptxas", "-v", "-o", str(cubin),
           str(src)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0 or "C75" in res.stderr or "ptxas warning" in res.stderr.lower():
        raise RuntimeError(f"nvcc: rc {res.returncode}\n{res.stderr[-4000:]}")
    return cubin


def measure(mod: Any, name: str, nwg: int, sms: int, words: Any) -> dict[str, float]:
    """Cycles a chunk (median and p90 over the blocks) of kernel ``name``, its third launch."""
    import cupy as cp

    f = mod.get_function(name)
    cyc = cp.zeros(sms, cp.uint64)
    out = cp.zeros(sms * 128 * nwg, cp.float32)
    for _ in range(3):  # the first launch loads the module
        f((sms,), (128 * nwg,), (words, cyc, out))
    cp.cuda.Device().synchronize()
    c = cyc.get().astype(np.float64) / ITER
    return {"median": round(float(np.median(c)), 1), "p90": round(float(np.percentile(c, 90)), 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/out")
    ap.add_argument("--commit", default="unknown")
    args = ap.parse_args()
    import cupy as cp

    tmp = Path(tempfile.mkdtemp(prefix="wgmma_overlap_"))
    mod = cp.RawModule(path=str(build(tmp)))
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    rng = np.random.default_rng(3)
    words = cp.asarray(rng.integers(0, 2**32, size=(32 * 4 * 4 * 4,), dtype=np.uint32))
    rows = []
    for nwg, r in SETS:
        cell = {}
        for key, mode, ss, pp in KERNELS:
            cell[key] = measure(mod, f"wo_g{nwg}_m{mode}_r{r}_s{ss}_p{pp}", nwg, sms, words)
        for (pr, pss), key in PINGPONG.items():
            if nwg == 2 and pr == r:
                cell[key] = measure(mod, f"wo_g2_m3_r{r}_s{pss}_p1", nwg, sms, words)
        row: dict[str, Any] = {"warpgroups": nwg, "dequant_repeats": r, **cell}
        for kind, (both_key, mma_key) in OVERLAPS.items():
            if both_key in cell:
                alu = cell["alu"]["median"]
                mma, both = cell[mma_key]["median"], cell[both_key]["median"]
                row[f"overlap_{kind}"] = round((alu + mma - both) / max(min(alu, mma), 1e-9), 2)
        rows.append(row)
        print(row, flush=True)
    import torch  # only for the device's name, as the other benches

    meta = {"command": "python3 " + " ".join(sys.argv), "commit": args.commit,
            "device": torch.cuda.get_device_name(), "sms": sms, "iterations": ITER}  # fmt: skip
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "wgmma_overlap.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = [f"# wgmma overlap ({meta['device']}, commit {meta['commit']})", "", f"`{meta['command']}`", "",
          "SM cycles a chunk (median over the blocks; 4 m64n64k16 wgmmas a warpgroup a chunk). A from "
          "registers (RS), from shared memory (SS), through shared memory the warpgroup itself wrote "
          "(SW); pp: two warpgroups taking turns at the wgmma issue. Overlap: (alu + mma - both) / "
          "min(alu, mma).", "",
          "| warpgroups | dequant x | alu | mma RS | mma SS | both RS | both SS | both SW | both RS pp "
          "| both SW pp | overlap RS | SS | SW | RS pp | SW pp |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def get(row: dict[str, Any], key: str) -> str:
        v = row.get(key)
        return "-" if v is None else str(v["median"] if isinstance(v, dict) else v)

    for row in rows:
        keys = ["warpgroups", "dequant_repeats", "alu", "mma_rs", "mma_ss", "both_rs", "both_ss", "both_sw",
                "both_rs_pp", "both_sw_pp"] + [f"overlap_{k}" for k in OVERLAPS]  # fmt: skip
        md.append("| " + " | ".join(get(row, k) for k in keys) + " |")
    (out / "wgmma_overlap.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
