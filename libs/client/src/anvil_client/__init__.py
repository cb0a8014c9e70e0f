"""anvil_client: the client SDK (HTTP and ZeroCopy clients: numpy in, numpy out).

    from anvil_client import Client, ZeroCopyClient

Names are resolved on first use (PEP 562): the `anvil` CLI imports this package too and needs
neither httpx nor zmq for most commands. What the SDK needs is the package's base dependencies;
the CLI and the load generator are the `cli` and `bench` extras (docs/client.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anvil_client.http import AsyncClient, Client, InferError
    from anvil_client.zerocopy_client import AsyncZeroCopyClient, ZeroCopyClient, ZeroCopyError

_HOMES = {
    "AsyncClient": "anvil_client.http",
    "Client": "anvil_client.http",
    "InferError": "anvil_client.http",
    "AsyncZeroCopyClient": "anvil_client.zerocopy_client",
    "ZeroCopyClient": "anvil_client.zerocopy_client",
    "ZeroCopyError": "anvil_client.zerocopy_client",
}

__all__ = ["AsyncClient", "AsyncZeroCopyClient", "Client", "InferError", "ZeroCopyClient", "ZeroCopyError"]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'anvil_client' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
