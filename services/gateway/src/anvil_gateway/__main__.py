"""`python -m anvil_gateway`: the HTTP gateway on uvicorn (uvloop + httptools)."""

from __future__ import annotations

import uvicorn

from anvil_core.logs import setup_logging
from anvil_core.metrics import serve_metrics
from anvil_gateway.app import create_app
from anvil_gateway.fastpath import FastInfer
from anvil_gateway.http_protocol import CoalescingHttpToolsProtocol
from anvil_gateway.settings import GatewaySettings


def main() -> None:
    settings = GatewaySettings()
    setup_logging("gateway", settings.log_level)
    serve_metrics(settings.metrics_port, "gateway", settings.service_id)
    app = create_app(settings)
    uvicorn.run(
        FastInfer(app, app.state.gw),
        host=settings.bind_host,
        port=settings.http_port,
        loop="uvloop",
        http=CoalescingHttpToolsProtocol,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
