"""The CPU batching window (EDF+PID): while the host's CPUs are busy, a batch not led by the top
priority waits a little for more requests instead of leaving the moment an executor is idle.

Core tests use an injected clock and exact predictions (t(B) = 4 ms + 1 ms x B, as in
test_core_scheduler.py); the host's busy fraction is set directly (``set_host_cpu``). The reader of
/proc/stat is tested on files written here."""

from __future__ import annotations

from pathlib import Path

import pytest

from anvil_scheduler.core import (
    AdmitOutcome,
    EdfPidPolicy,
    ExecutorSpec,
    ProfilePrior,
    SchedulerConfig,
    SchedulerCore,
)
from anvil_scheduler.host_cpu import HostCpu, parse_proc_stat

PRIOR = ProfilePrior(base_us=4000, per_item_us=1000)
WINDOW_US = 5000


def make_core(busy: float, **cfg: object) -> SchedulerCore:
    defaults = {"slack_guard_us": 1000, "slack_guard_fraction": 0.0, "dispatch_lead_us": 0}
    cfg = defaults | {"cpu_window_us": WINDOW_US} | cfg
    core = SchedulerCore(EdfPidPolicy(), SchedulerConfig(**cfg), PRIOR)  # type: ignore[arg-type]
    core.register_model("m", 32)
    core.register_executor(ExecutorSpec("e0", "gpu", 32, frozenset({"m"}), 2), 0.0)
    core.set_host_cpu(busy)
    return core


def admit(core: SchedulerCore, rid: str, priority: int, now: float, timeout: float | None = None) -> None:
    adm = core.admit(core.new_request(rid, "m", priority, now, timeout_s=timeout), now)
    assert adm.outcome is AdmitOutcome.QUEUED


# ---- the window's size -------------------------------------------------------------------------
def test_the_window_opens_linearly_between_the_busy_thresholds() -> None:
    cfg = SchedulerConfig(cpu_window_us=4000, cpu_busy_low=0.6, cpu_busy_high=1.0)
    assert cfg.cpu_window_s(0.0) == 0.0
    assert cfg.cpu_window_s(0.6) == 0.0
    assert cfg.cpu_window_s(0.8) == pytest.approx(0.002)
    assert cfg.cpu_window_s(1.0) == pytest.approx(0.004)
    assert SchedulerConfig(cpu_window_us=0).cpu_window_s(1.0) == 0.0  # 0 turns it off


@pytest.mark.parametrize(
    "cfg",
    [{"cpu_window_us": -1}, {"cpu_busy_low": 0.9, "cpu_busy_high": 0.9}, {"cpu_busy_high": 1.5}],
)
def test_a_window_configuration_out_of_range_is_refused(cfg: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SchedulerConfig(**cfg)  # type: ignore[arg-type]


def test_set_host_cpu_clamps_the_reading_and_returns_the_window() -> None:
    core = make_core(0.0)
    assert core.set_host_cpu(7.0) == pytest.approx(WINDOW_US / 1e6)
    assert core.cpu_busy == 1.0
    assert core.set_host_cpu(-1.0) == 0.0 and core.cpu_window_s == 0.0


# ---- release decisions --------------------------------------------------------------------------
def test_calm_cpus_release_at_once_to_an_idle_executor() -> None:
    core = make_core(busy=0.5)
    admit(core, "a", 3, 0.0)
    assert [b.request_ids for b in core.poll(0.0).batches] == [["a"]]


def test_busy_cpus_hold_lower_priority_work_for_the_window_then_release_it_together() -> None:
    core = make_core(busy=1.0)
    admit(core, "a", 3, 0.0)
    dec = core.poll(0.0)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(WINDOW_US / 1e6)
    admit(core, "b", 2, 0.002)  # joins the waiting batch; the head (earliest deadline) is now b
    dec = core.poll(0.002)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(0.002 + WINDOW_US / 1e6)
    (batch,) = core.poll(0.007).batches
    assert sorted(batch.request_ids) == ["a", "b"]


def test_the_top_priority_leads_a_batch_that_leaves_at_once_with_the_waiting_work() -> None:
    core = make_core(busy=1.0)
    admit(core, "bulk", 3, 0.0)
    assert core.poll(0.0).batches == ()
    admit(core, "gold", 1, 0.001)
    (batch,) = core.poll(0.001).batches
    assert batch.request_ids == ["gold", "bulk"]


def test_the_window_never_waits_past_the_heads_slack() -> None:
    core = make_core(busy=1.0)
    admit(core, "tight", 2, 0.0, timeout=0.009)  # must start by 9 - 5 - 1 = 3 ms, inside the window
    dec = core.poll(0.0)
    assert dec.batches == () and dec.next_wakeup_s == pytest.approx(0.003)
    assert [b.request_ids for b in core.poll(0.003).batches] == [["tight"]]


def test_a_full_batch_leaves_at_once_even_while_the_cpus_are_busy() -> None:
    core = make_core(busy=1.0)
    for i in range(32):
        admit(core, f"r{i}", 3, 0.0)
    (batch,) = core.poll(0.0).batches
    assert batch.size == 32


# ---- /proc/stat ---------------------------------------------------------------------------------
STAT = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\nintr 1 2\n"


def _write(path: Path, user: int, system: int, idle: int, iowait: int = 0) -> None:
    path.write_text(STAT.format(user=user, system=system, idle=idle, iowait=iowait))


def test_parse_proc_stat_counts_idle_and_iowait_as_not_busy() -> None:
    assert parse_proc_stat(STAT.format(user=10, system=5, idle=80, iowait=5)) == (15, 100)
    with pytest.raises(ValueError):
        parse_proc_stat("cpu0 1 2 3 4\n")


def test_host_cpu_smooths_the_busy_fraction_between_samples(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    _write(stat, user=0, system=0, idle=0)
    cpu = HostCpu(alpha=0.5, path=stat)
    assert cpu.sample() == 0.0  # one reading: nothing to compare yet
    _write(stat, user=60, system=20, idle=20)  # 80% busy over this interval
    assert cpu.sample() == pytest.approx(0.4)
    _write(stat, user=60, system=20, idle=20)  # no tick elapsed: unchanged
    assert cpu.sample() == pytest.approx(0.4)
    _write(stat, user=160, system=20, idle=20)  # 100% busy
    assert cpu.sample() == pytest.approx(0.7)


def test_an_unreadable_proc_stat_keeps_the_window_shut(tmp_path: Path) -> None:
    cpu = HostCpu(path=tmp_path / "missing")
    assert cpu.sample() == 0.0 and cpu.sample() == 0.0
    (tmp_path / "garbled").write_text("nothing here\n")
    assert HostCpu(path=tmp_path / "garbled").sample() == 0.0
    with pytest.raises(ValueError):
        HostCpu(alpha=0.0)
