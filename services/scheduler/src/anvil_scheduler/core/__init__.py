"""The scheduler's pure core: queues, batching policies, shedding, dispatch, exactly-once bookkeeping.

No I/O and no clock of its own: every call takes ``now_s``, so the same classes run in the service
(time.monotonic) and in ``bench/batching_sim.py`` (simulated time). Entry point: ``SchedulerCore``.
"""

from anvil_scheduler.core.config import DEFAULT_PRIORITIES, PriorityClass, SchedulerConfig
from anvil_scheduler.core.dispatch import ExecutorPool, ExecutorSpec
from anvil_scheduler.core.edf import EDFQueue, QueueOrder
from anvil_scheduler.core.ledger import RequestLedger
from anvil_scheduler.core.pid import PIDController, PIDGains
from anvil_scheduler.core.policies import (
    AimdConfig,
    AimdPolicy,
    EdfPidConfig,
    EdfPidPolicy,
    FixedDelayConfig,
    FixedDelayPolicy,
)
from anvil_scheduler.core.policy import BatchingPolicy, QueueView
from anvil_scheduler.core.profile import LatencyProfile, ProfileBook, ProfilePrior
from anvil_scheduler.core.request import Batch, Request, RequestState
from anvil_scheduler.core.scheduler import (
    Accounting,
    Admission,
    AdmitOutcome,
    Completion,
    Decision,
    Release,
    SchedulerCore,
)
from anvil_scheduler.core.shedding import Shed, ShedReason
from anvil_scheduler.core.slo import SLOTracker

__all__ = [
    "DEFAULT_PRIORITIES",
    "Accounting",
    "Admission",
    "AdmitOutcome",
    "AimdConfig",
    "AimdPolicy",
    "Batch",
    "BatchingPolicy",
    "Completion",
    "Decision",
    "EDFQueue",
    "EdfPidConfig",
    "EdfPidPolicy",
    "ExecutorPool",
    "ExecutorSpec",
    "FixedDelayConfig",
    "FixedDelayPolicy",
    "LatencyProfile",
    "PIDController",
    "PIDGains",
    "PriorityClass",
    "ProfileBook",
    "ProfilePrior",
    "QueueOrder",
    "QueueView",
    "Release",
    "Request",
    "RequestLedger",
    "RequestState",
    "SLOTracker",
    "SchedulerConfig",
    "SchedulerCore",
    "Shed",
    "ShedReason",
]
