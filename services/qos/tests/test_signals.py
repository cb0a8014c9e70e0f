"""Log2 histograms and the pressure meter (pure)."""

from __future__ import annotations

import pytest

from anvil_qos.hist import Log2Histogram, slot_bounds_us, slot_of_us
from anvil_qos.samples import GpuSample, ProcessSample, Sample, TcpSample
from anvil_qos.signals import PressureMeter
from anvil_qos.targets import Target

EXEC = Target("executor", "e1", 100)


def test_slots_match_bcc_log2l() -> None:
    # bcc: slot = us ? bpf_log2l(us) : 0, bpf_log2l(v) = floor(log2 v) + 1
    assert [slot_of_us(us) for us in (0, 0.5, 1, 2, 3, 4, 1023, 1024)] == [0, 0, 1, 2, 2, 3, 10, 11]
    for us in (0.2, 1, 7, 100, 5000):
        low, high = slot_bounds_us(slot_of_us(us))
        assert low <= us < high


def test_percentile_and_bounds() -> None:
    h = Log2Histogram({3: 90, 11: 10})  # 90 waits in [4, 8) µs, 10 in [1024, 2048) µs
    assert 4 <= h.percentile_us(0.5) < 8
    assert 1024 <= h.percentile_us(0.99) < 2048
    assert h.sum_bounds_us() == (90 * 4 + 10 * 1024, 90 * 8 + 10 * 2048)
    assert Log2Histogram().percentile_us(0.99) == 0.0
    assert h.delta(Log2Histogram({3: 40})) == Log2Histogram({3: 50, 11: 10})


def _sample(ts: float, waits: int, hist: Log2Histogram | None, retrans: int = 0, wait_ns: int = 0) -> Sample:
    proc = ProcessSample(
        EXEC, cpu_ns=int(ts * 5e8), runq_delay_ns=waits * 50_000, runq_events=waits, runq_hist=hist
    )
    tcp = TcpSample(8000, {"ESTABLISHED": 3}, {}, retrans, "port", 1500)
    gpu = GpuSample(EXEC, launches=int(ts * 1000), syncs=int(ts * 10), sync_wait_ns=wait_ns)
    return Sample("ebpf", ts, (proc,), (tcp,), (gpu,))


def test_meter_measures_over_the_window() -> None:
    meter = PressureMeter(window_s=2.0, min_events=20)
    assert meter.update(_sample(0.0, 0, Log2Histogram())) == []
    m = {x.name: x.value for x in meter.update(_sample(1.0, 100, Log2Histogram({11: 100}), 6, 800_000_000))}
    assert 1024 <= m["runq_p99_us"] < 2048
    assert m["cpu_cores"] == pytest.approx(0.5)
    assert m["retransmits_per_s"] == 6.0 and m["unacked_bytes"] == 1500.0
    assert m["gpu_launches_per_s"] == 1000.0 and m["gpu_sync_wait_share"] == pytest.approx(0.8)
    # Later readings are compared with the oldest one inside the window, not the first ever.
    meter.update(_sample(2.0, 200, Log2Histogram({11: 100, 3: 100})))
    m = {x.name: x.value for x in meter.update(_sample(3.5, 300, Log2Histogram({11: 100, 3: 200})))}
    assert 4 <= m["runq_p99_us"] < 8  # only the [4, 8) µs waits are in the window


def test_meter_skips_idle_processes_and_labels_procfs_means() -> None:
    meter = PressureMeter(window_s=1.0, min_events=20)
    meter.update(_sample(0.0, 0, None))
    m = {x.name: x.value for x in meter.update(_sample(1.0, 10, None))}
    assert "runq_mean_us" not in m and "runq_p99_us" not in m  # 10 waits: too few to say anything
    m = {x.name: x.value for x in meter.update(_sample(2.0, 100, None))}
    assert m["runq_mean_us"] == pytest.approx(50.0) and "runq_p99_us" not in m
