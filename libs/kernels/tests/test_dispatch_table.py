"""The measured W4A16 dispatch tables kept with the kernels (``anvil_kernels/cuda/tables``): loaded
per arch, the same as the benchmark's published table, and how many rows of a shape the W4A16
kernels may take before cuBLAS on dense weights measured faster (``DispatchTable.int4_max_rows``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from anvil_kernels.cuda import DispatchTable, packaged_table
from anvil_kernels.cuda.w4a16_dispatch import TABLES, choose, format_rows, parse_rows, table_from_rows

ROOT = Path(__file__).resolve().parents[3]


def test_the_sm90_table_is_packaged_and_is_the_published_measurement() -> None:
    table = packaged_table("sm_90")
    assert table is not None and table.arch == "sm_90"
    published = json.loads((ROOT / "bench" / "results" / "w4a16_dispatch.json").read_text())
    kept = json.loads((TABLES / "w4a16_sm_90.json").read_text())
    assert kept["entries"] == published["entries"], "copy bench/results/w4a16_dispatch.json into the package"
    assert packaged_table("sm_80") is None  # never measured: the rule decides


def _table(*entries: tuple[int, bool]) -> DispatchTable:
    rows = [{"K": 512, "N": 256, "M": m, "kernel": "gemv", "bf16_faster": slow} for m, slow in entries]
    return DispatchTable.from_json(json.dumps({"arch": "sm_90", "entries": rows}))


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        (((1, False), (4, False), (16, False), (64, True)), 16),  # INT4 ahead up to 16: all of m_max
        (((16, True), (128, True)), 0),  # dense ahead from the first measured M: never INT4
        (((1, False), (4, False), (16, True)), 4),  # dense ahead somewhere in 5..16: up to 4
        (((1, False), (8, False)), 16),  # nothing measured above 8: the rule's m_max
        (((32, False),), 16),  # one entry covering 1..32, INT4 ahead
    ],
)
def test_int4_max_rows_stops_before_the_first_shape_dense_won(entries: tuple, want: int) -> None:
    assert _table(*entries).int4_max_rows(16, 256, 512) == want


@pytest.mark.parametrize(
    ("entries", "want"),
    [
        (((1, False), (16, False), (64, False), (128, True)), 64),  # up to the entry before dense won
        (((16, True), (128, True)), 0),
        (((1, False), (32, False)), 32),  # never dense, but nothing measured past 32
        ((), 0),  # unmeasured
    ],
)
def test_int4_measured_rows_stop_before_dense_won_and_at_the_last_measurement(
    entries: tuple, want: int
) -> None:
    table = _table(*entries) if entries else _table((16, False))
    assert table.int4_measured_rows(256, 512 if entries else 1024) == want


def test_int4_max_rows_of_an_unmeasured_shape_is_the_rule() -> None:
    assert _table((16, True)).int4_max_rows(16, 256, 1024) == 16
    assert _table((16, True)).int4_max_rows(16, 128, 512) == 16


def test_measured_h200_rows_for_the_minilm_and_large_shapes() -> None:
    """What the compiler reads for the shapes bench/kernels_gpu.py measured on the H200."""
    table = packaged_table("sm_90")
    assert table is not None
    assert table.int4_max_rows(16, 1152, 384) == 0  # cuBLAS 2.9 us vs W4A16 4.0 at M = 16
    assert table.int4_max_rows(16, 1536, 384) == 0
    assert table.int4_max_rows(16, 384, 1536) == 16  # W4A16 3.7 vs cuBLAS 4.4
    assert table.int4_max_rows(16, 8192, 8192) == 16


def test_recorded_rows_round_trip_and_drive_choose() -> None:
    rows = {
        "sm_90": [
            (1, "gvb8w", None),
            (4, "gemv", None),
            (16, "gemv", None),
            (32, "mtc32", 8),
            (64, "wgs64n", None),
        ],
        "sm_89": [(16, "gemv", None)],
    }
    text = format_rows(rows)
    assert text == "sm_89:16=gemv;sm_90:1=gvb8w,4=gemv,16=gemv,32=mtc32/8,64=wgs64n"
    back = parse_rows(text)
    assert back == {a: tuple(r) for a, r in rows.items()}
    table = table_from_rows("sm_90", {(8192, 8192): back["sm_90"]})
    got = [choose(m, 8192, 8192, 128, table) for m in (1, 2, 4, 5, 16, 17, 32, 33, 64)]
    assert [(c.kernel, c.split) for c in got] == [
        ("gvb8w", None), ("gemv", None), ("gemv", None), ("gemv", None), ("gemv", None),
        ("mtc32", 8), ("mtc32", 8), ("wgs64n", None), ("wgs64n", None),
    ]  # fmt: skip
    assert choose(1, 8192, 8192, 128, table).source == "table"
    assert choose(65, 8192, 8192, 128, table).source == "rule"  # above the recorded rows
    assert choose(1, 4096, 4096, 128, table).source == "rule"  # another shape
    assert parse_rows("") == {}


@pytest.mark.parametrize(
    "text",
    [
        "sm_90:1=mtc65",  # no such kernel
        "sm_90:1=gemv/2",  # a split on a GEMV-like kernel
        "sm_90:1=mtc64/0",
        "sm_90:1=mtc64/65",  # past ROW_MAX_SPLIT
        "sm_90:1=mtc64/",
        "sm_90:1=mtc64/x",
        "sm_90:1=mtc64/2/2",
        "sm_90:4=gemv,1=gvb8w",  # M not increasing
        "sm_90:0=gemv",
        "sm_90:x=gemv",
        "sm_90:1gemv",
        "sm90:1=gemv",
        "sm_9a:1=gemv",
        "sm_90:1=gemv;sm_90:4=gemv",  # an arch twice
        "sm_90:1=gemv\n",
    ],
)
def test_recorded_rows_are_checked_not_trusted(text: str) -> None:
    with pytest.raises(ValueError, match="w4a16 rows"):
        parse_rows(text)
