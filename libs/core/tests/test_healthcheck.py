"""The container healthcheck: 0 on a 2xx answer, 1 with the reason otherwise."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from anvil_core.healthcheck import check, main


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/ok" else 503)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def port() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield str(server.server_address[1])
    server.shutdown()
    server.server_close()


def test_2xx_is_healthy(port: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert check("P", "/ok", {"P": port}) == ""
    monkeypatch.setenv("ANVIL_TEST_PORT", port)
    assert main(["ANVIL_TEST_PORT", "ok"]) == 0


def test_an_error_status_a_closed_port_or_no_port_is_unhealthy(port: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "503" in check("P", "/down", {"P": port})
    assert check("P", "/ok", {"P": "1"}).startswith("http://127.0.0.1:1/ok")
    assert "not a port number" in check("P", "/ok", {})
    assert main(["ONE_ARG"]) == 2 and "usage" in capsys.readouterr().err
