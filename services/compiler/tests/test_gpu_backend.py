"""Which backend an INT4 linear of an fp16 GPU plan gets (codegen/gpu_backend.py): the W4A16 kernels
up to W4A16_MAX_M rows by the rule, fewer (or none) where the measured table kept with the kernels
for one of the plan's archs has cuBLAS on dense weights faster at that shape, and, in a plan for
sm_90 alone, the table's tensor-core tiles as far as they measured faster than cuBLAS; and what the
artifact's w4a16.fatbin is then built with (build_w4a16, against a stand-in nvcc)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from anvil_compiler.codegen.build import build_w4a16
from anvil_compiler.codegen.gpu_backend import (
    W4A16_MAX_M,
    gv_configs_of,
    linear_backend,
    tile_configs_of,
    tiles_allowed,
)
from anvil_kernels.cuda import packaged_table

_TABLE_W4A16 = {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "table sm_90"}


def _int4(k: int, n: int) -> dict[str, np.ndarray]:
    return {"packed": np.zeros((k // 2, n), np.uint8)}  # K/2 bytes of two nibbles per column


@pytest.mark.parametrize(
    ("k", "n", "want"),
    [
        (384, 1152, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM qkv
        (384, 1536, {"gpu_backend": "cublas_f16_dequant", "w4a16_from": "table sm_90"}),  # MiniLM fc1
        (1536, 384, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:16=gvb8w"}),  # MiniLM fc2
        (8192, 8192, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:1=gvb8w,4=gvb8w,16=gemv"}),
        (14336, 4096, {**_TABLE_W4A16, "w4a16_kernels": "sm_90:1=gvb8w,4=gvb8w,16=gemv"}),
        (512, 256, {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "rule"}),  # unmeasured
    ],
)
def test_int4_linears_follow_the_measured_table(k: int, n: int, want: dict) -> None:
    assert linear_backend(_int4(k, n), 128, "fp16", ("sm_80", "sm_90")) == want


def test_without_a_measured_arch_the_rule_decides() -> None:
    got = linear_backend(_int4(384, 1152), 128, "fp16", ("sm_80",))  # sm_80 was never measured
    assert got == {"gpu_backend": "w4a16", "w4a16_max_m": W4A16_MAX_M, "w4a16_from": "rule"}


def test_other_linears_are_unchanged() -> None:
    assert linear_backend({"weight": np.zeros((384, 1152), np.float32)}, 0, "fp16", ("sm_90",)) == {
        "gpu_backend": "cublas_f16"
    }
    assert linear_backend(_int4(384, 1152), 128, "fp32", ("sm_90",)) == {"gpu_backend": "plan_int4"}
    assert linear_backend(_int4(384, 1152), 32, "fp16", ("sm_90",)) == {"gpu_backend": "cublas_f16_dequant"}


@pytest.mark.parametrize("archs", [("sm_90",), ("sm_80", "sm_90")])
def test_the_recorded_kernels_are_the_tables_choices_up_to_w4a16_max_m(archs: tuple[str, ...]) -> None:
    """Every measured shape: the rows are the table's (tiles with their split) up to w4a16_max_m, and
    w4a16_max_m is the last measured M before cuBLAS won (sm_90 alone: tiles allowed) or that within
    the rule's 16 rows with GEMV-like kernels only (rows naming a tile there: none, the rule runs)."""
    table = packaged_table("sm_90")
    assert table is not None
    tiles = tiles_allowed(archs)
    for (k, n), entries in table.entries.items():
        got = linear_backend(_int4(k, n), 128, "fp16", archs)
        cap = table.int4_measured_rows(n, k) if tiles else table.int4_max_rows(W4A16_MAX_M, n, k)
        if cap == 0:
            assert got["gpu_backend"] == "cublas_f16_dequant", (k, n)
            continue
        assert got["gpu_backend"] == "w4a16" and got["w4a16_max_m"] == cap, (k, n, got)
        want = []
        for m, choice in entries:  # every measured row that decides some M in 1..w4a16_max_m
            want.append(f"{m}={choice.kernel}" + (f"/{choice.split}" if choice.split and m > 16 else ""))
            if m >= cap:
                break
        if not tiles and any("mtc" in w or "wg" in w or "tc" in w for w in want):
            assert "w4a16_kernels" not in got, (k, n)
            continue
        assert got["w4a16_kernels"].removeprefix("sm_90:").split(",") == want, (k, n)


def test_an_sm90_plan_runs_the_tables_tiles_where_they_beat_cublas() -> None:
    """8192x8192 on the H200 at 9877a4f: wgs32 (split 4) at M = 32 and wgs64nd (split 4) at 64
    measured faster than cuBLAS bf16, cuBLAS faster from 128: W4A16 up to 64 rows, the tiles in the
    rows."""
    got = linear_backend(_int4(8192, 8192), 128, "fp16", ("sm_90",))
    assert got == {
        **_TABLE_W4A16,
        "w4a16_max_m": 64,
        "w4a16_kernels": "sm_90:1=gvb8w,4=gvb8w,16=gemv,32=wgs32/4,64=wgs64nd/4",
    }
    assert tiles_allowed(("sm_90",)) and not tiles_allowed(("sm_80", "sm_90")) and not tiles_allowed(())
    assert not tiles_allowed(("sm_100",))  # never measured, and wgmma's sm_90a code runs on sm_90 alone


def test_the_w4a16_build_gets_the_ring_gemvs_and_tiles_the_rows_name() -> None:
    texts = [
        linear_backend(_int4(k, n), 128, "fp16", ("sm_90",))["w4a16_kernels"]
        for k, n in ((8192, 8192), (14336, 4096), (4096, 14336))
    ]
    assert gv_configs_of(texts) == ["gvb8w"]
    assert gv_configs_of(texts[1:2]) == ["gvb8w"]  # 14336x4096: gvb8w measured fastest at 1 and 4 rows
    assert tile_configs_of(texts) == ["mtc32", "wgs32", "wgs64n", "wgs64nd"]
    plain = [linear_backend(_int4(8192, 8192), 128, "fp16", ("sm_80", "sm_90"))["w4a16_kernels"]]
    assert tile_configs_of(plain) == []


_FAKE_NVCC = """#!/usr/bin/env python3
import sys
from pathlib import Path
args = sys.argv[1:]
Path(args[args.index("-o") + 1]).write_bytes(b"fatbin")
src = Path(args[-1]).read_text()
Path(sys.argv[0]).with_name("calls.txt").open("a").write(
    " ".join(a for a in args if a.startswith("arch=")) + "|" + ",".join(
        line.split("(")[1].split(",")[0] for line in src.splitlines() if line.startswith("ANVIL_W4A16_")
    ) + "\\n"
)
"""


def test_build_w4a16_compiles_the_named_tiles_as_sm90a(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fatbin's nvcc call (a stand-in nvcc on PATH records it): a plan for sm_90 with tiles builds
    sm_90a code holding them; tiles for any other archs are refused with the reason, not built."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvcc").write_text(_FAKE_NVCC)
    (bin_dir / "nvcc").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "art"
    out.mkdir()
    files, why = build_w4a16([128], ("sm_90",), out, ["gvb8w"], "bf16", ["mtc32", "wgs64n"])
    assert (files, why) == ({"w4a16": "w4a16.fatbin"}, "")
    arch, kernels = (bin_dir / "calls.txt").read_text().splitlines()[-1].split("|")
    assert arch == "arch=compute_90a,code=sm_90a"
    names = set(kernels.split(","))
    assert {"w4a16mtc32_bf16_c2", "w4a16wgs64n_bf16_c2", "w4a16gvb8w_bf16_m1_c2"} <= names, names
    assert not any(k.startswith(("w4a16tc", "w4a16wgs64nd", "w4a16mtc64")) for k in names), names
    files, why = build_w4a16([128], ("sm_90",), out, [], "fp16", [])  # no tiles: plain sm_90 code
    assert (bin_dir / "calls.txt").read_text().splitlines()[-1].split("|")[0] == "arch=compute_90,code=sm_90"
    files, why = build_w4a16([128], ("sm_80", "sm_90"), out, [], "fp16", ["mtc32"])
    assert files == {} and "sm_90 alone" in why
