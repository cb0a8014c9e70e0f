"""The gateway's root span of a request (only when tracing is on: anvil_core.tracing).

``gateway.infer`` (``/v2/models/{m}/infer``) and ``gateway.embeddings`` (``/v1/embeddings``) are
SERVER spans, children of the client's W3C ``traceparent`` header when it sends one; inside them
the handlers open ``gateway.parse``, ``gateway.admit``, ``gateway.dispatch`` (sent to the scheduler
-> answered) and ``gateway.answer``. The root's context travels on in ``InferRequest.traceparent``:
the scheduler's and executor's spans of the request hang below it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response

from anvil_core import tracing

__all__ = ["server"]


async def server(
    name: str, request: Request, model: str, handler: Callable[[], Awaitable[Response]]
) -> Response:
    """`handler()` inside the root span `name`; the answer's status is its attribute (an error
    status for 5xx answers)."""
    attrs = {"anvil.model": model, "http.request.method": request.method, "url.path": request.url.path}
    with tracing.server_span(name, request.headers.get("traceparent"), attrs) as span:
        response = await handler()
        span.set_attribute("http.response.status_code", response.status_code)
        if response.status_code >= 500:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"HTTP {response.status_code}"))
        return response
