"""KServe v2 infer responses: JSON data, the binary tensor extension, or shared-memory outputs."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response

from anvil_core.tensors import HostTensor
from anvil_gateway import json_codec
from anvil_gateway.json_tensors import BadRequest, tensor_to_json
from anvil_gateway.kserve import ParsedRequest
from anvil_gateway.sysshm import SystemShm

__all__ = ["infer_response"]

HEADER_LENGTH = "Inference-Header-Content-Length"


def infer_response(
    model: str,
    version: str,
    parsed: ParsedRequest,
    outputs: list[HostTensor],
    shm: SystemShm | None,
    headers: dict[str, str],
) -> Response:
    """Encode `outputs` as the request asked: JSON data, binary sections, or writes into shm regions.

    Binary layout: the JSON header (its length in Inference-Header-Content-Length), then each binary
    output's raw bytes in the order the outputs appear in the header.
    """
    asked = {o.name: o for o in parsed.outputs}
    doc: dict[str, Any] = {"model_name": model, "model_version": version or "1"}
    if parsed.id is not None:
        doc["id"] = parsed.id
    entries: list[dict[str, Any]] = []
    blobs: list[bytes | memoryview] = []
    for t in outputs:
        req = asked.get(t.name)
        if req is not None and req.shm is not None:
            assert shm is not None
            region_name, offset, size = req.shm
            raw = t.to_bytes_view()
            if len(raw) > size:
                raise BadRequest(
                    f"output {t.name!r} needs {len(raw)} bytes; shared_memory_byte_size is {size}"
                )
            region = parsed.region(region_name)  # pinned by the request, so still registered
            region.write(offset, raw, f"output {t.name!r}")
            # As Triton answers: no data and no parameters (its C++ client reads binary_data_size
            # from any output that has parameters); the bytes are in the client's region.
            entries.append({"name": t.name, "datatype": t.datatype, "shape": list(t.shape)})
            continue
        binary = parsed.binary_output if req is None or req.binary is None else req.binary
        if binary:
            raw = t.to_bytes_view()
            blobs.append(raw)
            entries.append(
                {
                    "name": t.name,
                    "datatype": t.datatype,
                    "shape": list(t.shape),
                    "parameters": {"binary_data_size": len(raw)},
                }
            )
        else:
            entries.append(tensor_to_json(t))
    doc["outputs"] = entries
    head = json_codec.dumps(doc)
    if not blobs:
        return Response(head, media_type="application/json", headers=headers)
    body = b"".join([head, *blobs])
    return Response(
        body, media_type="application/octet-stream", headers={**headers, HEADER_LENGTH: str(len(head))}
    )
