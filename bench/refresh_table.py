"""Take a device run's measured W4A16 dispatch table into the package (issue #17).

``bench/kernels_gpu.py`` writes ``w4a16_dispatch.json`` for the shapes it measured. The packaged table
(``anvil_kernels/cuda/tables/w4a16_sm_<n>.json``) and its published copy
(``bench/results/w4a16_dispatch.json``, which a CPU test holds equal to it) also hold shapes that run
did not measure (e.g. MiniLM's, with ``--no-minilm``). This script replaces, shape by shape, every
(K, N) the run measured, keeps the others with their provenance, writes both files, and prints what
changed per shape and M (old kernel/split -> new, and where cuBLAS bf16 now wins or loses).

It refuses a run of another arch, a run whose device does not match ``--device`` (default "H200": the
table the compiler reads was measured there, and an H100's ``bf16_faster`` decisions do not carry
over: cuBLAS bf16 is bandwidth-bound at M = 64-128 and the H200 has 43% more bandwidth), a shape
with a gap in its M values compared with what the table held, an empty run, and a table the
package would not load (``DispatchTable.from_json``: an unknown kernel, a split on a GEMV-like one).

    python3 bench/refresh_table.py RUN_DIR/w4a16_dispatch.json [--device H200] [--dry-run]

The compiler's tests that name the table's rows (services/compiler/tests/test_gpu_backend.py) must
then be updated by hand to the new choices; `make test` says where.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from anvil_kernels.cuda.w4a16_dispatch import TABLES, DispatchTable

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = ROOT / "bench" / "results" / "w4a16_dispatch.json"

Shape = tuple[int, int]


def _by_shape(entries: list[dict[str, Any]]) -> dict[Shape, list[dict[str, Any]]]:
    out: dict[Shape, list[dict[str, Any]]] = {}
    for e in entries:
        out.setdefault((int(e["K"]), int(e["N"])), []).append(e)
    return out


def _cell(e: dict[str, Any] | None) -> str:
    if e is None:
        return "-"
    split = f"/{e['split']}" if e.get("split") else ""
    return f"{e['kernel']}{split}{' (cuBLAS faster)' if e['bf16_faster'] else ''}"


def merge(old: dict[str, Any], new: dict[str, Any], device: str) -> tuple[dict[str, Any], list[str]]:
    """The packaged table ``old`` with every shape ``new`` measured replaced; and the changes, one
    line each. Raises ValueError where ``new`` must not go into the package."""
    if new.get("arch") != old.get("arch"):
        raise ValueError(f"the run is for {new.get('arch')!r}, the table for {old.get('arch')!r}")
    if device.lower() not in str(new.get("device", "")).lower():
        raise ValueError(f"the run's device is {new.get('device')!r}, not {device!r} (--device)")
    if not new.get("entries"):
        raise ValueError("the run measured nothing (no entries)")
    olds, news = _by_shape(old["entries"]), _by_shape(new["entries"])
    changes = []
    for shape, rows in news.items():
        had = {int(e["M"]) for e in olds.get(shape, [])}
        missing = had - {int(e["M"]) for e in rows}
        if missing:
            raise ValueError(f"{shape[0]} x {shape[1]}: the run did not measure M = {sorted(missing)}")
        before = {int(e["M"]): e for e in olds.get(shape, [])}
        for e in sorted(rows, key=lambda e_: int(e_["M"])):
            was = before.get(int(e["M"]))
            if was is None or _cell(was) != _cell(e):
                changes.append(f"{shape[0]} x {shape[1]} M = {e['M']}: {_cell(was)} -> {_cell(e)}")
    kept = [e for e in old["entries"] if (int(e["K"]), int(e["N"])) not in news]
    shapes = ", ".join(f"{k} x {n}" for k, n in news)
    provenance = f"{new.get('commit', 'unknown')} ({shapes})"
    if kept:
        provenance += f"; the other shapes as before: {old.get('commit', 'unknown')}"
    merged = {
        "arch": old["arch"],
        "device": new["device"],
        "commit": provenance,
        "entries": [e for rows in news.values() for e in rows] + kept,
    }
    try:  # what the package loads: known kernels, a split only after a tile (KernelChoice checks)
        DispatchTable.from_json(json.dumps(merged))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"the merged table does not load: {exc!r}") from exc
    return merged, changes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="a device run's w4a16_dispatch.json")
    ap.add_argument("--device", default="H200", help="the device the run must name (substring)")
    ap.add_argument("--dry-run", action="store_true", help="print the changes, write nothing")
    args = ap.parse_args(argv)
    new = json.loads(args.run.read_text())
    packaged = TABLES / f"w4a16_{new.get('arch')}.json"
    if not packaged.exists():
        print(f"no packaged table {packaged.name} for arch {new.get('arch')!r}", file=sys.stderr)
        return 2
    try:
        merged, changes = merge(json.loads(packaged.read_text()), new, args.device)
    except ValueError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    print("\n".join(changes) or "no choice changed")
    if not args.dry_run:
        text = json.dumps(merged, indent=1) + "\n"
        for path in (packaged, PUBLISHED):
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
