"""What the KServe v2 metadata calls answer, built once for both front ends (routes_meta.py over
HTTP as JSON, grpc_meta.py over gRPC as the same fields in protobuf)."""

from __future__ import annotations

from typing import Any

from anvil_core.model_spec import ModelSpec, TensorSpec
from anvil_core.priorities import PRIORITIES
from anvil_gateway.peer_stats import stats_doc
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.state import SERVER_NAME, SERVER_VERSION, GatewayState

__all__ = ["EXTENSIONS", "model_config", "model_metadata", "server_metadata", "server_ready", "statistics"]

EXTENSIONS = [
    "binary_tensor_data",
    "system_shared_memory",
    "statistics",
    "schedule_policy",
    "model_configuration",
    "model_repository",
]


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": SERVER_VERSION, "extensions": EXTENSIONS}


async def server_ready(st: GatewayState) -> tuple[bool, str]:
    """(ready, why not): the scheduler link alive and the registry's view ready (discovery.ready)."""
    if st.link.died is not None:  # the answers of the scheduler can no longer reach anyone
        return False, st.link.died
    ready, why = await st.discovery.ready()
    if ready and st.link.unconnected is not None:  # a Unix link (re)connecting: requests would fail
        return False, st.link.unconnected
    return ready, why


def _tensors(spec: ModelSpec, which: str) -> list[dict[str, Any]]:
    return [
        {"name": t.name, "datatype": t.datatype, "shape": t.full_shape(spec.max_batch)}
        for t in getattr(spec, which)
    ]


def model_metadata(spec: ModelSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "versions": [spec.version],
        "platform": spec.platform,
        "inputs": _tensors(spec, "inputs"),
        "outputs": _tensors(spec, "outputs"),
    }


def _config_tensor(t: TensorSpec) -> dict[str, Any]:
    return {
        "name": t.name,
        "data_type": f"TYPE_{'STRING' if t.datatype == 'BYTES' else t.datatype}",
        "dims": list(t.dims),
    }


def model_config(spec: ModelSpec, s: GatewaySettings) -> dict[str, Any]:
    """Triton's model configuration shape (perf_analyzer reads max_batch_size and the tensors)."""
    return {
        "name": spec.name,
        "platform": spec.platform,
        "backend": "anvil",
        "version_policy": {"latest": {"num_versions": 1}},
        "max_batch_size": spec.max_batch,
        "input": [_config_tensor(t) for t in spec.inputs],
        "output": [_config_tensor(t) for t in spec.outputs],
        "dynamic_batching": {
            "preferred_batch_size": [],
            "max_queue_delay_microseconds": 0,
            "priority_levels": 3,
            "default_priority_level": s.default_priority,
            "priority_queue_policy": {
                str(p): {"default_timeout_microseconds": s.slo_ms(p) * 1000} for p in PRIORITIES
            },
        },
        "instance_group": [{"name": spec.name, "kind": "KIND_AUTO", "count": 1}],
    }


async def statistics(st: GatewayState, specs: list[ModelSpec]) -> dict[str, Any]:
    """Triton's statistics document of these models (stats.py), summed over every gateway process
    (peer_stats.py): `GET /v2/models[/{m}]/stats` and the ModelStatistics RPC both answer this."""
    return await stats_doc(st, [(spec.name, spec.version) for spec in specs])
