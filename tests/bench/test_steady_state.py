"""bench/steady_state.py's probes and arithmetic: which processes are executors, their resident memory,
the GPUs' memory from nvidia-smi (and why not, where it is absent), and the drift of a series."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from steady_state import drift, executor_pids, gpu_mem_mib, rss_mib


def _proc(root: Path, pid: int, cmd: list[str], rss_kb: int | None) -> None:
    d = root / str(pid)
    d.mkdir(parents=True)
    (d / "cmdline").write_bytes(b"\0".join(c.encode() for c in cmd) + b"\0")
    status = "Name:\tpython\n" + (f"VmRSS:\t{rss_kb} kB\n" if rss_kb is not None else "")
    (d / "status").write_text(status)


def test_executors_are_found_by_their_command_line_and_measured(tmp_path: Path) -> None:
    _proc(tmp_path, 101, ["python3", "-m", "anvil_executor"], 204800)
    _proc(tmp_path, 102, ["python3", "-m", "anvil_gateway"], 1024)
    _proc(tmp_path, 7, ["/usr/bin/python", "-m", "anvil_executor", "--x"], None)  # a kernel thread has no RSS
    (tmp_path / "self").mkdir()
    assert executor_pids(tmp_path) == [7, 101]
    assert rss_mib(101, tmp_path) == 200.0
    assert rss_mib(7, tmp_path) is None
    assert rss_mib(999, tmp_path) is None  # gone


def test_drift_is_the_end_against_the_windows_after_warm_up() -> None:
    assert drift([900, 500, 510, 505, 520, 530, 540]) == {"from": 505, "to": 530, "mib": 25, "pct": 4.95}
    assert drift([1.0, 2.0, 3.0, 4.0]) is None  # too few windows to say


def test_gpu_memory_from_nvidia_smi_or_why_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert gpu_mem_mib() == "no nvidia-smi on PATH"
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho '0, 2048'\necho '1, [N/A]'\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    assert os.access(smi, os.X_OK)
    assert gpu_mem_mib() == {"0": 2048.0}
