"""A discrete PID controller with output clamping and conditional-integration anti-windup.

Generic: it knows nothing about batches. ``EdfPidPolicy`` feeds it a normalised latency error and reads
the output as the target batch size B*. The derivative acts on the measurement, not the error, so a
setpoint change gives no kick, and it is low-pass filtered because the measurement (a windowed p99) is
noisy.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PIDController", "PIDGains"]


@dataclass(frozen=True)
class PIDGains:
    kp: float  # output units per unit of error
    ki: float  # output units per (unit of error x second)
    kd: float = 0.0  # output units per (unit of error / second)
    derivative_tau_s: float = 0.1  # first-order filter on the derivative term


class PIDController:
    """u = bias + kp*e + I - kd*d(measured)/dt, clamped to [low, high].

    Anti-windup: the integral only accumulates when that does not push an already-saturated output
    further into saturation, and it is itself kept within [low - bias, high - bias]. After a long
    saturation the output therefore leaves the limit on the first sample whose error has the other sign.
    """

    def __init__(self, gains: PIDGains, low: float, high: float, initial: float) -> None:
        if low > high:
            raise ValueError(f"PID limits are inverted: low={low} > high={high}")
        self.gains = gains
        self.low, self.high = low, high
        self.bias = min(max(initial, low), high)
        self.integral = 0.0
        self.output = self.bias
        self._last_measured: float | None = None
        self._deriv = 0.0
        self.saturated = False

    def set_limits(self, low: float, high: float) -> None:
        """Change the output range (e.g. an executor with a smaller max batch joined or left)."""
        if low > high:
            raise ValueError(f"PID limits are inverted: low={low} > high={high}")
        self.low, self.high = low, high
        self.integral = min(max(self.integral, low - self.bias), high - self.bias)
        self.output = min(max(self.output, low), high)

    def update(self, setpoint: float, measured: float, dt_s: float) -> float:
        """One control step, ``dt_s`` seconds after the previous one. Returns the new output."""
        g = self.gains
        error = setpoint - measured
        if self._last_measured is not None and dt_s > 0:
            raw = -(measured - self._last_measured) / dt_s
            alpha = dt_s / (g.derivative_tau_s + dt_s)
            self._deriv += alpha * (raw - self._deriv)
        self._last_measured = measured
        candidate = self.integral + g.ki * error * max(dt_s, 0.0)
        unclamped = self.bias + g.kp * error + candidate + g.kd * self._deriv
        # Conditional integration: keep the new integral unless the output is pinned at a limit and the
        # error asks to go further past it.
        pushing_high = unclamped > self.high and error > 0
        pushing_low = unclamped < self.low and error < 0
        if not (pushing_high or pushing_low):
            self.integral = min(max(candidate, self.low - self.bias), self.high - self.bias)
        u = self.bias + g.kp * error + self.integral + g.kd * self._deriv
        self.output = min(max(u, self.low), self.high)
        self.saturated = self.output != u
        return self.output
