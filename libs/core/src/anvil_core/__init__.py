"""anvil_core: what every Anvil service shares (settings, logging, registry, sockets, wire codecs).

The names below are resolved on first use (PEP 562), not at import: the client SDK imports
`anvil_core.tensors`, `.codec` and `.zerocopy`, which need only numpy and flatbuffers, while
`Registry` and `ServiceSettings` need the `service` extra (redis, pydantic). Importing the package
must not require what a submodule does not use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from anvil_core.codec import PROTOCOL_VERSION, ProtocolError
    from anvil_core.model_spec import ModelSpec, SpecError, TensorSpec
    from anvil_core.registry import Registry
    from anvil_core.settings import ServiceSettings
    from anvil_core.tensors import HostTensor, TensorError

# public name -> the submodule that defines it
_HOMES = {
    "PROTOCOL_VERSION": "anvil_core.codec",
    "ProtocolError": "anvil_core.codec",
    "HostTensor": "anvil_core.tensors",
    "TensorError": "anvil_core.tensors",
    "ModelSpec": "anvil_core.model_spec",
    "SpecError": "anvil_core.model_spec",
    "TensorSpec": "anvil_core.model_spec",
    "Registry": "anvil_core.registry",
    "ServiceSettings": "anvil_core.settings",
}

__all__ = [
    "PROTOCOL_VERSION",
    "HostTensor",
    "ModelSpec",
    "ProtocolError",
    "Registry",
    "ServiceSettings",
    "SpecError",
    "TensorError",
    "TensorSpec",
]


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'anvil_core' has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)
