"""An ASGI front for the hot routes: POST .../infer and POST /v1/embeddings go straight to their
handlers.

FastAPI's routing, dependency solving and middleware stack cost more CPU per request than the
whole infer pipeline (measured with py-spy at ~35% of the gateway's time under load). The same
handler serves the FastAPI route (for the OpenAPI document and in-process tests); this front
only skips the framework around it. Every other path, and the lifespan, go to FastAPI.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from anvil_core.logs import get_logger
from anvil_gateway.embeddings import handle_embeddings, oa_error
from anvil_gateway.infer import handle_infer
from anvil_gateway.state import GatewayState, error

__all__ = ["FastInfer"]

log = get_logger("anvil.gateway.fastpath")
_INFER = re.compile(r"^/v2/models/([^/]+)(?:/versions/([^/]+))?/infer$")
EMBEDDINGS = "/v1/embeddings"


class FastInfer:
    def __init__(self, app: Any, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = _INFER.match(scope["path"])
            if match:
                try:
                    response = await handle_infer(self.state, Request(scope, receive), match[1], match[2])
                except Exception:  # a bug, never bad input: answer 500 and keep serving
                    log.exception("infer failed")
                    response = error(500, "internal error (logged by the gateway)")
                await response(scope, receive, send)
                return
            if scope["path"] == EMBEDDINGS:
                try:
                    response = await handle_embeddings(self.state, Request(scope, receive))
                except Exception:  # a bug, never bad input: answer 500 and keep serving
                    log.exception("embeddings failed")
                    response = oa_error(500, "internal error (logged by the gateway)", "server_error")
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
