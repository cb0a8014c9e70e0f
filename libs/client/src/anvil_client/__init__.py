"""anvil_client: the ZeroCopy clients (imported lazily: the CLI does not need numpy or zmq)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anvil_client.zerocopy_client import AsyncZeroCopyClient, ZeroCopyClient, ZeroCopyError

__all__ = ["AsyncZeroCopyClient", "ZeroCopyClient", "ZeroCopyError"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from anvil_client import zerocopy_client

        return getattr(zerocopy_client, name)
    raise AttributeError(f"module 'anvil_client' has no attribute {name!r}")
