"""Batching policies behind ``BatchingPolicy``: Anvil's EDF + PID and the two peers it is compared to."""

from anvil_scheduler.core.policies.aimd import AimdConfig, AimdPolicy
from anvil_scheduler.core.policies.edf_pid import EdfPidConfig, EdfPidPolicy
from anvil_scheduler.core.policies.fixed_delay import FixedDelayConfig, FixedDelayPolicy

__all__ = [
    "AimdConfig",
    "AimdPolicy",
    "EdfPidConfig",
    "EdfPidPolicy",
    "FixedDelayConfig",
    "FixedDelayPolicy",
]
