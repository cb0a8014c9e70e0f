"""The scheduler's settings reach its core: the slack guard (EDF+PID's margin before a deadline) and
late binding, and the CPU batching window."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from anvil_scheduler.service import Scheduler
from anvil_scheduler.settings import SchedulerSettings


def _scheduler(**kw: object) -> Scheduler:
    return Scheduler(
        SchedulerSettings(
            gateway_port=0,
            executor_port=0,
            link_bind_host="127.0.0.1",
            zmq_curve=False,
            **kw,  # type: ignore[arg-type]
        )
    )


def test_the_guard_and_late_binding_settings_reach_the_core() -> None:
    s = _scheduler(slack_guard_us=7000, slack_guard_fraction=0.2, late_binding=True)
    try:
        assert (s.core.config.slack_guard_us, s.core.config.slack_guard_fraction) == (7000, 0.2)
        assert s.core.config.late_binding
        assert s.core.config.guard_s(0.050) == pytest.approx(0.007 + 0.2 * 0.050)
    finally:
        s.gw.close()
        s.ex.close()
        s.ctx.term()


@pytest.mark.parametrize("env", [{"ANVIL_SLACK_GUARD_FRACTION": "1.0"}, {"ANVIL_SLACK_GUARD_US": "-1"}])
def test_a_guard_out_of_range_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str]
) -> None:
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(ValidationError):
        SchedulerSettings()


def test_the_cpu_window_is_off_by_default_and_reads_the_host_cpu_when_set() -> None:
    off = _scheduler()
    on = _scheduler(cpu_window_us=3000, cpu_busy_low=0.5, cpu_busy_high=0.9)
    try:
        assert off.host_cpu is None and off.core.config.cpu_window_us == 0
        assert on.host_cpu is not None
        assert (on.core.config.cpu_window_us, on.core.config.cpu_busy_low) == (3000, 0.5)
        assert on.core.config.cpu_window_s(0.9) == pytest.approx(0.003)
    finally:
        for s in (off, on):
            s.gw.close()
            s.ex.close()
            s.ctx.term()


def test_a_cpu_window_with_its_thresholds_reversed_is_refused_at_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANVIL_CPU_BUSY_LOW", "0.9")
    monkeypatch.setenv("ANVIL_CPU_BUSY_HIGH", "0.5")
    with pytest.raises(ValidationError, match="cpu_busy_low < cpu_busy_high"):
        SchedulerSettings()
