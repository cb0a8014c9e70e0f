"""bench/gpu_scale.py's configuration parser, its GPU availability rule and its two-GPU check (the
orchestration itself runs with `--profile cpu --model identity`, docs/executor_gpu.md)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from gpu_scale import parse_configs, unavailable
from scale_probe import GpuSampler
from scale_report import ratios
from scale_stack import ScaleConfig

from anvil_client.gpus import Visible


def test_configs_in_order_with_defaults() -> None:
    got = parse_configs(" gpus=0,epg=1; gpus=0 ,epg=4;gpus=1+0;")
    assert got == [ScaleConfig((0,), 1), ScaleConfig((0,), 4), ScaleConfig((0, 1), 1)]
    assert [c.label for c in got] == ["gpus=0,epg=1", "gpus=0,epg=4", "gpus=0+1,epg=1"]
    assert [c.executors for c in got] == [1, 4, 2]
    laned = parse_configs("gpus=0,epg=1,lanes=4;gpus=0,epg=1")
    assert laned == [ScaleConfig((0,), 1, 4), ScaleConfig((0,), 1, 1)]
    assert [c.label for c in laned] == ["gpus=0,epg=1,lanes=4", "gpus=0,epg=1"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no configuration"),
        ("epg=2", "gpus=... is required"),
        ("gpus=0,epg=9", r"ANVIL_EXECUTORS_PER_GPU='9'.*1 to 8"),
        ("gpus=0,epg=0", "1 to 8"),
        ("gpus=0,epg=two", "1 to 8"),
        ("gpus=a", "'a' is not an index"),
        ("gpus=-1", "is not an index"),
        ("gpus=0+0", "GPU 0 is listed twice"),
        ("gpus=0,lanes=0", "lanes='0' is not a whole number in 1..16"),
        ("gpus=0,lanes=17", "1..16"),
        ("gpus=0,lanes=x", "1..16"),
        ("gpus=0,gpus=1", "expected gpus="),
        ("gpus=0,mig=1", "expected gpus="),
        ("gpus0", "expected gpus="),
        ("gpus=0;gpus=0,epg=1", "gpus=0,epg=1 is listed twice"),
    ],
)
def test_bad_configs_are_refused_naming_the_item(text: str, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_configs(text)


def test_a_config_needing_a_missing_gpu_says_why() -> None:
    one = Visible(1, "nvidia-smi -L")
    assert unavailable(ScaleConfig((0,), 4), one) is None
    assert unavailable(ScaleConfig((0, 1), 1), one) == "needs GPU 1, 1 visible (nvidia-smi -L)"
    assert unavailable(ScaleConfig((0, 1), 1), Visible(None, "no nvidia-smi")) is None  # trusted


def _row(workload: str, conc: int, items: float, p99: float) -> dict[str, Any]:
    return {"workload": workload, "concurrency": conc, "items_per_s": items, "p99_ms": p99}


def test_ratios_to_the_first_config_and_the_two_gpu_check() -> None:
    configs: list[dict[str, Any]] = [
        {"config": "gpus=0,epg=1", "rows": [_row("minilm", 16, 10_000, 40), _row("minilm", 64, 12_000, 120)]},
        {"config": "gpus=0,epg=2", "rows": [_row("minilm", 16, 13_000, 35), _row("minilm", 64, 15_000, 100)]},
        {
            "config": "gpus=0+1,epg=1",
            "rows": [_row("minilm", 16, 19_000, 45), _row("minilm", 64, 24_000, 90)],
        },
    ]
    got, x2 = ratios(configs)
    assert [r["ratio"] for r in got] == [1.0, 1.0, 1.3, 1.25, 1.9, 2.0]
    assert configs[2]["rows"][0]["ratio_to_first"] == 1.9
    # gated: MiniLM c16 (ratio and p99), not c64
    assert x2["status"] == "met" and [c["concurrency"] for c in x2["checks"]] == [16]
    configs[2]["rows"][0]["p99_ms"] = 51
    assert ratios(configs)[1]["status"] == "not met"


def test_two_gpu_check_says_why_it_did_not_run() -> None:
    one = {"config": "gpus=0,epg=1", "rows": [_row("minilm", 16, 10_000, 40)]}
    assert "no 2-GPU configuration" in ratios([one])[1]["why"]
    skipped = {"config": "gpus=0+1,epg=1", "skipped": "needs GPU 1, 1 visible (nvidia-smi -L)"}
    x2 = ratios([one, skipped])[1]
    assert x2["status"] == "not run" and "needs GPU 1" in x2["why"]


def test_gpu_sampler_reads_nvidia_smi_lines(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Utilisation and memory per GPU from `nvidia-smi --query-gpu ... -lms` lines; `[N/A]` rows are
    skipped, and where nvidia-smi is absent the sampler says so."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        'case "$*" in *"--query-gpu=index,utilization.gpu,memory.used"*"-lms 200"*) ;; *) exit 2;; esac\n'
        "printf '0, 40, 1000\\n1, [N/A], 5\\n0, 60, 1200\\n1, 10, 7\\n'\nexec sleep 30\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    sampler = GpuSampler()
    sampler.start()
    deadline = time.monotonic() + 10
    while sum(len(s) for s in sampler.samples.values()) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    got = sampler.stop()
    assert got == {
        "0": {"util_mean_pct": 50.0, "util_max_pct": 60.0, "mem_max_mib": 1200.0, "samples": 2},
        "1": {"util_mean_pct": 10.0, "util_max_pct": 10.0, "mem_max_mib": 7.0, "samples": 1},
    }
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    none = GpuSampler()
    none.start()
    assert none.stop() == "no nvidia-smi on PATH"
