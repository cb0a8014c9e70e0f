"""anvil_core: what every Anvil service shares (settings, logging, registry, sockets, wire codecs)."""

from anvil_core.codec import PROTOCOL_VERSION, ProtocolError
from anvil_core.model_spec import ModelSpec, SpecError, TensorSpec
from anvil_core.registry import Registry
from anvil_core.settings import ServiceSettings
from anvil_core.tensors import HostTensor, TensorError

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
