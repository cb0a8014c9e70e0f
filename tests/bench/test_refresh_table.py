"""bench/refresh_table.py: a device run's measured shapes replace the packaged table's, the others
stay, and a run that must not go into the package (another device or arch, an M missing, nothing
measured, a kernel the package does not know) is refused."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from refresh_table import PUBLISHED, TABLES, main, merge


def _e(k: int, n: int, m: int, kernel: str, split: int | None = None, slow: bool = False) -> dict[str, Any]:
    return {"K": k, "N": n, "M": m, "kernel": kernel, "split": split, "bf16_faster": slow}


OLD = {
    "arch": "sm_90",
    "device": "NVIDIA H200",
    "commit": "aaaaaaa",
    "entries": [
        _e(8192, 8192, 1, "gvb8w"),
        _e(8192, 8192, 64, "wgs64nd", 4),
        _e(8192, 8192, 128, "wgs128w", 4, slow=True),
        _e(384, 1536, 16, "gvb8w", slow=True),
    ],
}


def _run(device: str = "NVIDIA H200", arch: str = "sm_90", entries: list | None = None) -> dict[str, Any]:
    rows = entries if entries is not None else [
        _e(8192, 8192, 1, "gvb8w"),
        _e(8192, 8192, 64, "wgs64ndk2tu", 2),
        _e(8192, 8192, 128, "wgs64ndk2tu", 2),
    ]  # fmt: skip
    return {"arch": arch, "device": device, "commit": "bbbbbbb", "entries": rows}


def test_measured_shapes_are_replaced_and_the_others_kept() -> None:
    merged, changes = merge(OLD, _run(), "H200")
    assert merged["entries"][:3] == _run()["entries"]
    assert merged["entries"][3:] == [_e(384, 1536, 16, "gvb8w", slow=True)]  # MiniLM's row stays
    assert merged["device"] == "NVIDIA H200" and merged["arch"] == "sm_90"
    assert merged["commit"].startswith("bbbbbbb (8192 x 8192)") and "aaaaaaa" in merged["commit"]
    assert changes == [
        "8192 x 8192 M = 64: wgs64nd/4 -> wgs64ndk2tu/2",
        "8192 x 8192 M = 128: wgs128w/4 (cuBLAS faster) -> wgs64ndk2tu/2",
    ]  # M = 1 unchanged: not listed


@pytest.mark.parametrize(
    ("run", "match"),
    [
        (_run(device="NVIDIA H100 80GB HBM3"), "not 'H200'"),
        (_run(arch="sm_100"), "sm_100"),
        (_run(entries=[_e(8192, 8192, 1, "gvb8w"), _e(8192, 8192, 64, "wgs64nd", 4)]), r"M = \[128\]"),
        (_run(entries=[]), "measured nothing"),
        (  # a kernel the package no longer builds (taken out after the thirty-fifth session)
            _run(entries=[_e(8192, 8192, m, "wgs64ndk4", 4) for m in (1, 64, 128)]),
            "does not load",
        ),
    ],
)
def test_a_run_that_must_not_go_into_the_package_is_refused(run: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        merge(OLD, run, "H200")


def test_another_device_is_taken_when_named() -> None:
    merged, _ = merge(OLD, _run(device="NVIDIA H100 80GB HBM3"), "H100")
    assert merged["device"] == "NVIDIA H100 80GB HBM3"


def test_the_packaged_table_rerun_unchanged_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real packaged table as a run of its own: no choice changes, and --dry-run writes nothing."""
    packaged = TABLES / "w4a16_sm_90.json"
    before = (packaged.read_bytes(), PUBLISHED.read_bytes())
    table = json.loads(packaged.read_text())
    run = tmp_path / "w4a16_dispatch.json"
    run.write_text(json.dumps({**table, "commit": "ccccccc"}))
    assert main([str(run), "--dry-run"]) == 0
    assert capsys.readouterr().out.strip() == "no choice changed"
    assert (packaged.read_bytes(), PUBLISHED.read_bytes()) == before
    run.write_text(json.dumps({**table, "device": "NVIDIA H100 80GB HBM3"}))
    assert main([str(run), "--dry-run"]) == 1
    assert "refused" in capsys.readouterr().err
