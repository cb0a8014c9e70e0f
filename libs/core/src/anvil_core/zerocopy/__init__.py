"""ZeroCopy ingress protocol: doorbell header, shared-memory region of slots, slot metadata.

The byte-level specification is docs/protocol.md; the code here is its single definition, shared by
the client, the gateway (which serves it: ``anvil_gateway.zerocopy_server`` and its ``zc_*``
modules) and the executor (which reads inputs in place). The region's Redis key is
``anvil_core.keys.shm_key``.
"""

from anvil_core.zerocopy.header import (
    HEADER,
    HEADER_BYTES,
    Flag,
    Header,
    HeaderError,
    Op,
    Status,
    ZeroCopyError,
)
from anvil_core.zerocopy.meta import InferMeta, MetaError, ResultMeta, TensorDesc
from anvil_core.zerocopy.region import Region, RegionError

__all__ = [
    "HEADER",
    "HEADER_BYTES",
    "Flag",
    "Header",
    "HeaderError",
    "InferMeta",
    "MetaError",
    "Op",
    "Region",
    "RegionError",
    "ResultMeta",
    "Status",
    "TensorDesc",
    "ZeroCopyError",
]
