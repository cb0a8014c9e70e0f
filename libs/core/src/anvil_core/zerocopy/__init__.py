"""ZeroCopy ingress protocol: doorbell header, shared-memory region of slots, slot metadata.

The byte-level specification is docs/protocol.md; the code here is its single definition.
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
from anvil_core.zerocopy.served import shm_key

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
    "shm_key",
]
