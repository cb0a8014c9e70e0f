"""The gateway's errors (HTTP statuses, as `Failed` carries them) as gRPC status codes, the way Triton
maps its errors, plus the metadata helpers every RPC uses.

| HTTP | gRPC | when |
|---|---|---|
| 400 | INVALID_ARGUMENT | bad input: shape, datatype, priority, timeout, contents, shm bounds |
| 401 | UNAUTHENTICATED | no API key, or an unknown one, with ANVIL_REQUIRE_API_KEY=1 |
| 403 | PERMISSION_DENIED | system shm off, an shm object of another owner/mode/tenant |
| 404 | NOT_FOUND | unknown model or version, unregistered region |
| 409 | ALREADY_EXISTS / FAILED_PRECONDITION | region registered already / in use (per RPC) |
| 413 | RESOURCE_EXHAUSTED | request over the model's size limit (what gRPC answers over its own cap) |
| 429 | UNAVAILABLE | shed, over a rate or the in-flight bound (`retry-after` s in the trailers) |
| 499 | CANCELLED | the client went away |
| 500, 502 | INTERNAL | a bug, an undecodable executor answer |
| 501 | UNIMPLEMENTED | CUDA shared memory |
| 503 | UNAVAILABLE | no executor, scheduler link down, registry unreachable |
| 504 | DEADLINE_EXCEEDED | no answer within the deadline |

429 is UNAVAILABLE, not RESOURCE_EXHAUSTED: it is Triton's code for a request its full queue or rate
limiter refused, so clients written for Triton treat ours alike, and it is the code gRPC retry
policies retry. RESOURCE_EXHAUSTED stays what gRPC itself answers for a message over its size cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

import grpc

from anvil_gateway.request_path import TRACE_HEADER, Failed

__all__ = ["CODES", "abort", "code_of", "metadata"]

CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,
    429: grpc.StatusCode.UNAVAILABLE,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def code_of(status: int, overrides: Mapping[int, grpc.StatusCode] | None = None) -> grpc.StatusCode:
    """The gRPC code of an HTTP status (`overrides` first); another 4xx: INVALID_ARGUMENT, 5xx: INTERNAL."""
    if overrides and status in overrides:
        return overrides[status]
    return CODES.get(status, grpc.StatusCode.INVALID_ARGUMENT if status < 500 else grpc.StatusCode.INTERNAL)


def metadata(context: grpc.aio.ServicerContext) -> dict[str, Any]:
    """The call's metadata as a header mapping (keys are lower case in gRPC, as the gateway's
    header names are: `authorization`, `x-api-key`, `traceparent`, `x-anvil-trace-id`)."""
    return dict(context.invocation_metadata() or ())


async def abort(
    context: grpc.aio.ServicerContext,
    exc: Failed,
    trace: str | None = None,
    overrides: Mapping[int, grpc.StatusCode] | None = None,
) -> NoReturn:
    """End the call with the error's code and message; `retry-after` and the trace id travel in the
    trailing metadata as HTTP sends them in headers."""
    trailing: list[tuple[str, str]] = [(k.lower(), v) for k, v in exc.headers.items()]
    if trace is not None:
        trailing.append((TRACE_HEADER, trace))
    await context.abort(code_of(exc.status, overrides), str(exc), tuple(trailing))
    raise AssertionError("context.abort returned")  # it raises; this satisfies NoReturn
