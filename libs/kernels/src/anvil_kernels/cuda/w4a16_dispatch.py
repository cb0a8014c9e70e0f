"""Which W4A16 kernel runs a call of shape (M, K, N): the GEMV-like kernel (``w4a16.cu``) or a tile
of the tensor-core kernel (``w4a16_tc.cu``); both read the same prepacked weights.

``choose(m, n, k, g, table=None)`` returns a ``KernelChoice``; ``KernelChoice.as_dict()`` is what a
plan stores (plain JSON types) and ``KernelChoice.from_dict`` reads it back. With a ``DispatchTable``
(written by ``bench/kernels_gpu.py --table-out``, measured on one GPU arch) the fastest measured
kernel for the nearest measured M at or above m wins, for that exact (K, N); otherwise ``RULE``
decides. The rule follows the H200 run at af3a678 (bench/results/kernels_gpu.md): the GEMV-like
kernel up to M = 16 (fastest or within 1% on the three large shapes), then the Marlin-like tiles
(mtc32 at M = 32, mtc64 at 64, mtc128w above), which beat the older tc tiles at every measured
M >= 32 (8192x8192: M = 32 28.4 vs 39.4 us, M = 256 126 vs 170 us).

The measured tables are kept with the kernels: ``tables/w4a16_<arch>.json`` (a copy of the bench's
``w4a16_dispatch.json``, bench/results keeps the same file; a test checks they agree), read by
``packaged_table(arch)``. The compiler asks ``DispatchTable.int4_max_rows`` (GEMV-like kernels only,
up to a cap) or ``int4_measured_rows`` (tiles too) how many rows of a linear the W4A16 kernels may take
before cuBLAS on dense weights measured faster (0: never), and records the table's rows up to there in
the plan (``format_rows`` / ``parse_rows``)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from anvil_kernels.cuda.w4a16_gv import GV_CONFIGS
from anvil_kernels.cuda.w4a16_mtc import MTC_CONFIGS
from anvil_kernels.cuda.w4a16_tc import TC_CONFIGS

GEMV = "gemv"
# the GEMV-like kernels (no split: split-K is inside the block): w4a16.cu's register ring and the
# shared-memory ring configs of w4a16_gv.cu (the measured table may pick one; the rule never does)
GEMV_LIKE: tuple[str, ...] = (GEMV, *GV_CONFIGS)
KERNELS: tuple[str, ...] = (*GEMV_LIKE, *TC_CONFIGS, *MTC_CONFIGS)

# (largest M, kernel) in increasing M; the last row covers every larger M.
RULE: tuple[tuple[int, str], ...] = ((16, GEMV), (32, "mtc32"), (64, "mtc64"), (1 << 30, "mtc128w"))
# the rows the rule gives to GEMV-like kernels, which every W4A16 build holds (tiles only by a plan's rows)
RULE_GEMV_ROWS = max(m for m, kernel in RULE if kernel in GEMV_LIKE)


@dataclass(frozen=True)
class KernelChoice:
    """kernel: "gemv", a GV_CONFIGS, a TC_CONFIGS or an MTC_CONFIGS name; split: split-K factor for tc/mtc
    (None: planned at load from the GPU's SM count); source: "table" or "rule"; bf16_faster: the
    table measured cuBLAS bf16 faster than every INT4 kernel at this shape (the plan may prefer
    dense weights)."""

    kernel: str
    split: int | None = None
    source: str = "rule"
    bf16_faster: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in KERNELS:
            raise ValueError(f"kernel must be one of {KERNELS}, got {self.kernel!r}")
        if self.split is not None and (self.kernel in GEMV_LIKE or self.split < 1):
            raise ValueError(f"split={self.split} needs a tc kernel and must be >= 1")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> KernelChoice:
        return cls(
            kernel=str(d["kernel"]),
            split=None if d.get("split") is None else int(d["split"]),
            source=str(d.get("source", "rule")),
            bf16_faster=bool(d.get("bf16_faster", False)),
        )


@dataclass(frozen=True)
class DispatchTable:
    """Measured choices for one GPU arch: entries[(K, N)] = sorted ((M, KernelChoice), ...)."""

    arch: str
    entries: Mapping[tuple[int, int], tuple[tuple[int, KernelChoice], ...]]

    @classmethod
    def from_json(cls, text: str) -> DispatchTable:
        """{"arch": "sm_90", "entries": [{"K", "N", "M", "kernel", "split", "bf16_faster"}, ...]}"""
        doc = json.loads(text)
        rows: dict[tuple[int, int], list[tuple[int, KernelChoice]]] = {}
        for e in doc["entries"]:
            ch = KernelChoice.from_dict({**e, "source": "table"})
            rows.setdefault((int(e["K"]), int(e["N"])), []).append((int(e["M"]), ch))
        return cls(str(doc["arch"]), {kn: tuple(sorted(v, key=lambda t: t[0])) for kn, v in rows.items()})

    @classmethod
    def load(cls, path: str | Path) -> DispatchTable:
        return cls.from_json(Path(path).read_text())

    def int4_max_rows(self, m_max: int, n: int, k: int) -> int:
        """Rows (at most ``m_max``) up to which no measured entry for (K, N) has cuBLAS bf16 faster
        than every INT4 kernel: an entry at M covers the rows above the previous entry's M up to M,
        so the first ``bf16_faster`` entry caps the rows at the previous entry's M (0 when it is the
        first). ``m_max`` where (K, N) was not measured or nothing up to m_max was faster dense."""
        rows, dense_won = self._int4_ahead(n, k)
        return min(rows, m_max) if dense_won else m_max

    def int4_measured_rows(self, n: int, k: int) -> int:
        """Rows up to which the measured entries for (K, N) have an INT4 kernel ahead of cuBLAS bf16:
        the M of the entry before the first ``bf16_faster`` one, else the largest measured M (no
        measurement says anything past it); 0 where (K, N) was not measured or dense won first."""
        return self._int4_ahead(n, k)[0]

    def _int4_ahead(self, n: int, k: int) -> tuple[int, bool]:
        """(the M of the last entry before the first ``bf16_faster`` one, or of the last entry;
        whether a ``bf16_faster`` entry was found)."""
        prev = 0
        for mm, ch in self.entries.get((k, n), ()):
            if ch.bf16_faster:
                return prev, True
            prev = mm
        return prev, False

    def lookup(self, m: int, n: int, k: int) -> KernelChoice | None:
        rows = self.entries.get((k, n))
        if not rows:
            return None
        for mm, ch in rows:
            if m <= mm:
                return ch
        return None  # above the largest measured M: the rule decides


TABLES = Path(__file__).with_name("tables")


@functools.cache
def packaged_table(arch: str) -> DispatchTable | None:
    """The measured table kept with the kernels for ``arch`` (e.g. "sm_90"), None where that arch was
    never measured. Read once per process (the compiler asks per linear)."""
    path = TABLES / f"w4a16_{arch}.json"
    if not path.is_file():
        return None
    table = DispatchTable.load(path)
    if table.arch != arch:
        raise ValueError(f"{path.name} holds arch {table.arch!r}, not {arch!r}")
    return table


def choose(m: int, n: int, k: int, g: int, table: DispatchTable | None = None) -> KernelChoice:
    """The kernel for one call shape (x (M, K) @ W (K, N), groups of g along K)."""
    if m < 1 or n < 1 or k < 1:
        raise ValueError(f"M, N, K must be positive, got {(m, n, k)}")
    if table is not None:
        hit = table.lookup(m, n, k)
        if hit is not None:
            return hit
    for m_max, kernel in RULE:
        if m <= m_max:
            return KernelChoice(kernel)
    raise AssertionError("RULE's last row covers every M")


Row = tuple[int, str, int | None]  # (M, kernel, split): a recorded row; split None for GEMV-like
ROW_MAX_SPLIT = 64  # the largest split-K a recorded row may name (the kernels' planners check more)


def format_rows(per_arch: Mapping[str, Sequence[Row]]) -> str:
    """Measured (M, kernel, split) rows per arch as one line, ``"sm_90:1=gvb8w,16=gemv,32=mtc32/8"``
    (``/split`` only where a tile's split is recorded): a plan's ``w4a16_kernels`` attr (the
    compiler's gpu_backend.py), read back by ``parse_rows``."""

    def item(row: Row) -> str:
        m, kernel, split = row
        return f"{m}={kernel}" + ("" if split is None else f"/{split}")

    return ";".join(f"{a}:" + ",".join(map(item, rows)) for a, rows in sorted(per_arch.items()))


def parse_rows(text: str) -> dict[str, tuple[Row, ...]]:
    """The inverse of ``format_rows``; ValueError on anything else (a plan is checked, not
    trusted): arches ``sm_<digits>``, M positive and increasing, kernels of ``KERNELS``, a split
    (1..ROW_MAX_SPLIT) only after a tile."""
    out: dict[str, tuple[Row, ...]] = {}
    for part in filter(None, text.split(";")):
        arch, sep, rows_text = part.partition(":")
        if not sep or not arch.startswith("sm_") or not arch[3:].isdigit() or arch in out:
            raise ValueError(f"w4a16 rows: bad arch in {part!r}")
        rows: list[Row] = []
        for item in rows_text.split(","):
            m_text, sep, rest = item.partition("=")
            kernel, slash, split_text = rest.partition("/")
            ok = sep and m_text.isdigit() and kernel in KERNELS
            if slash:
                ok = ok and kernel not in GEMV_LIKE and split_text.isdigit()
                ok = ok and 1 <= int(split_text or 0) <= ROW_MAX_SPLIT
            if not ok:
                want = f"M=kernel, or M=tile/split with split in 1..{ROW_MAX_SPLIT}"
                raise ValueError(f"w4a16 rows: bad row {item!r} ({want})")
            m = int(m_text)
            if m < 1 or (rows and m <= rows[-1][0]):
                raise ValueError(f"w4a16 rows: M must be positive and increasing in {part!r}")
            rows.append((m, kernel, int(split_text) if slash else None))
        out[arch] = tuple(rows)
    return out


def table_from_rows(arch: str, shapes: Mapping[tuple[int, int], Sequence[Row]]) -> DispatchTable:
    """A DispatchTable of recorded rows (``parse_rows``' rows of one arch, per (K, N)): what a plan
    chose at compile time, handed to ``W4A16Linear(table=...)`` at load."""
    return DispatchTable(
        arch,
        {
            kn: tuple((m, KernelChoice(kernel, split, source="table")) for m, kernel, split in rows)
            for kn, rows in shapes.items()
        },
    )
