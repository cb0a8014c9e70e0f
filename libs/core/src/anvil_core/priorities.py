"""The priority classes every service shares, defined once: their numbers, names and default SLOs.

The gateway sets a request's deadline from its class's SLO, the scheduler orders and sheds by it,
qos watches priority 1's attainment against it, and `anvil bench` reports attainment with it. Each
service reads the operator's values from the same settings (``ANVIL_SLO_P{1,2,3}_MS``,
``anvil_core.settings.ServiceSettings``); these are their defaults.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

__all__ = ["DEFAULT_SLO_MS", "PRIORITIES", "PRIORITY_NAMES"]

PRIORITIES: tuple[int, ...] = (1, 2, 3)  # lower = more important; the wire codec refuses others

PRIORITY_NAMES: Mapping[int, str] = MappingProxyType({1: "interactive", 2: "standard", 3: "batch"})

DEFAULT_SLO_MS: Mapping[int, int] = MappingProxyType(
    {
        # 50 ms: a person is waiting on a UI; ~100 ms is where interaction stops feeling instant,
        # and the gateway, network and client take the other half.
        1: 50,
        # 200 ms: service-to-service calls inside a larger request (retrieval, ranking) with their
        # own budget. The default class.
        2: 200,
        # 2 s: offline/bulk work that still wants an answer soon; it is what batching feeds on.
        3: 2000,
    }
)
