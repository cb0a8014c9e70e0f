"""PID controller: step response settles without oscillating, stays bounded, recovers after saturation."""

import itertools

import pytest

from anvil_scheduler.core import PIDController, PIDGains


def run_plant(pid: PIDController, load: list[float], gain: float = 0.02, dt: float = 0.05) -> list[float]:
    """Static plant with a one-period lag, as EdfPidPolicy sees it: the p99 best-case latency / budget
    rises by ~0.02 per request of B* (measured in bench/batching_sim.py) on top of a load term."""
    out, measured = [], 0.0
    for d in load:
        u = pid.update(setpoint=0.65, measured=measured, dt_s=dt)
        measured = gain * u + d
        out.append(u)
    return out


def test_step_response_settles_without_oscillation() -> None:
    pid = PIDController(PIDGains(kp=6.0, ki=12.0), low=1.0, high=32.0, initial=32.0)
    load = [0.0] * 40 + [0.2] * 400  # a step in load at t = 2 s (periods of 50 ms)
    u = run_plant(pid, load)
    final = (0.65 - 0.2) / 0.02  # 22.5: where measured == setpoint
    after = u[40:]
    assert all(1.0 <= x <= 32.0 for x in u)
    assert u[39] == 32.0  # before the step: headroom, output pinned at the top
    settled_from = next(i for i in range(len(after)) if all(abs(x - final) < 0.05 * final for x in after[i:]))
    assert settled_from * 0.05 <= 12.0  # this plant is ~3x less steep than the simulated burst's
    # No oscillation: the approach never turns back by more than a rounding-sized 0.1 of a request.
    assert all(b <= a + 0.1 for a, b in itertools.pairwise(after))
    assert min(after) > final * 0.99


def test_output_is_clamped_to_the_limits() -> None:
    pid = PIDController(PIDGains(kp=100.0, ki=100.0), low=1.0, high=8.0, initial=4.0)
    assert pid.update(0.5, -10.0, 0.05) == 8.0
    assert pid.update(0.5, 10.0, 0.05) == 1.0


def test_anti_windup_recovers_promptly_after_long_saturation() -> None:
    pid = PIDController(PIDGains(kp=6.0, ki=12.0), low=1.0, high=32.0, initial=32.0)
    for _ in range(2000):  # 100 s of headroom: the output sits at the top the whole time
        pid.update(setpoint=0.65, measured=0.1, dt_s=0.05)
    assert pid.output == 32.0 and pid.saturated
    assert pid.integral <= 32.0 - pid.bias  # the integral did not wind up past the limit
    pid.update(setpoint=0.65, measured=0.9, dt_s=0.05)  # now over target
    assert pid.output < 32.0  # leaves the limit on the first sample, not after unwinding 100 s


def test_limits_can_move() -> None:
    pid = PIDController(PIDGains(kp=1.0, ki=1.0), low=1.0, high=32.0, initial=32.0)
    pid.set_limits(1.0, 16.0)
    assert pid.output == 16.0
    with pytest.raises(ValueError, match="inverted"):
        pid.set_limits(5.0, 2.0)
