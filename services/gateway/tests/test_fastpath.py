"""The ASGI front (fastpath.py): the hot routes reach their handlers without FastAPI around them;
every other request goes to the app."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.responses import Response

from anvil_gateway import fastpath


class _App:
    def __init__(self) -> None:
        self.paths: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.paths.append(scope["path"])
        await Response(b"app")(scope, receive, send)


def _call(front: fastpath.FastInfer, method: str, path: str) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        sent.append(msg)

    scope = {"type": "http", "method": method, "path": path, "headers": [], "query_string": b""}
    asyncio.run(front(scope, receive, send))
    return sent


def test_embeddings_go_straight_to_their_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Any] = []

    async def handler(st: Any, request: Any) -> Response:
        seen.append(st)
        return Response(b"embedded")

    monkeypatch.setattr(fastpath, "handle_embeddings", handler)
    app, state = _App(), object()
    sent = _call(fastpath.FastInfer(app, state), "POST", "/v1/embeddings")  # type: ignore[arg-type]
    assert seen == [state] and app.paths == []
    assert sent[-1]["body"] == b"embedded"
    _call(fastpath.FastInfer(app, state), "GET", "/v1/embeddings")  # type: ignore[arg-type]
    _call(fastpath.FastInfer(app, state), "POST", "/v1/models")  # type: ignore[arg-type]
    assert app.paths == ["/v1/embeddings", "/v1/models"] and len(seen) == 1


def test_a_handler_bug_answers_500_in_openai_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(st: Any, request: Any) -> Response:
        raise RuntimeError("bug")

    monkeypatch.setattr(fastpath, "handle_embeddings", broken)
    sent = _call(fastpath.FastInfer(_App(), object()), "POST", "/v1/embeddings")  # type: ignore[arg-type]
    assert sent[0]["status"] == 500 and b'"server_error"' in sent[-1]["body"]
