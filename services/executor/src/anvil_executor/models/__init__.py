"""Models an executor can run. A model is a `Model` (contract in base.py)."""

from anvil_executor.models.base import Model, RequestInputs, RequestOutputs
from anvil_executor.models.builtin import BUILTIN, load_builtin

__all__ = ["BUILTIN", "Model", "RequestInputs", "RequestOutputs", "load_builtin"]
