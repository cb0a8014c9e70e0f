"""`python -m anvil_compiler`: the compiler's HTTP API on uvicorn."""

from __future__ import annotations

import uvicorn

from anvil_compiler.app import create_app
from anvil_compiler.settings import CompilerSettings
from anvil_core.logs import setup_logging
from anvil_core.metrics import serve_metrics


def main() -> None:
    settings = CompilerSettings()
    setup_logging("compiler", settings.log_level)
    serve_metrics(settings.metrics_port, "compiler", settings.service_id)
    uvicorn.run(
        create_app(settings),
        host=settings.bind_host,
        port=settings.http_port,
        loop="uvloop",
        http="httptools",
        log_config=None,
        access_log=False,
    )


if __name__ == "__main__":
    main()
