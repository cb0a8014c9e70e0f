"""`python -m anvil_gateway`: the HTTP gateway on uvicorn (uvloop + httptools); with
``ANVIL_HTTP_WORKERS=N`` (N > 1), N gateway processes sharing the port (workers.py)."""

from __future__ import annotations

import sys

from anvil_core.logs import setup_logging
from anvil_gateway.settings import GatewaySettings
from anvil_gateway.workers import serve, supervise


def main() -> None:
    settings = GatewaySettings()
    setup_logging("gateway", settings.log_level)
    if settings.http_workers > 1:
        sys.exit(supervise(settings))
    serve(settings)


if __name__ == "__main__":
    main()
