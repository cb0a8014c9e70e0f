"""KServe v2 HTTP clients: numpy arrays in, numpy arrays out.

    from anvil_client.http import Client
    with Client("http://localhost:8000") as c:
        out = c.infer("mlp", {"INPUT0": np.ones((1, 16), np.float32)})    # {"OUTPUT0": ndarray}

    async with AsyncClient("http://localhost:8000") as c:
        outs = await asyncio.gather(*(c.infer("mlp", {"INPUT0": x}) for x in xs))

Tensors travel in the binary tensor extension both ways (`http_codec` has the layout), over one
keep-alive connection pool (httpx). `priority` is the request's class (1 interactive, 2 standard,
3 batch; 0: the server's default) and `timeout_us` tightens its deadline; an API key, when given,
goes in `Authorization: Bearer` and chooses the tenant. Every failure is an `InferError` whose
`status` is the HTTP status (429 shed, 504 deadline, 400 bad input, ...) or 0 when no answer came.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

import httpx
import numpy as np

from anvil_client.http_codec import InferError, decode_response, encode_request

__all__ = ["AsyncClient", "Client", "InferError"]


def _path(model: str, version: str) -> str:
    base = f"/v2/models/{quote(model, safe='')}"
    return f"{base}/versions/{quote(version, safe='')}" if version else base


def _headers(api_key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _json(resp: httpx.Response) -> dict[str, Any]:
    if resp.status_code != 200:
        decode_response(resp.status_code, resp.headers, resp.content)  # raises the error it carries
    doc = resp.json()
    if not isinstance(doc, dict):
        raise InferError(0, f"expected a JSON object, got {type(doc).__name__}")
    return doc


class Client:
    """Synchronous client; safe to share between threads (httpx.Client is)."""

    def __init__(
        self, url: str = "http://localhost:8000", timeout_s: float = 10.0, api_key: str = ""
    ) -> None:
        self._http = httpx.Client(base_url=url, timeout=timeout_s, headers=_headers(api_key))

    def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] = (),
        priority: int = 0,
        timeout_us: int = 0,
        datatypes: Mapping[str, str] | None = None,
        version: str = "",
        request_id: str | None = None,
    ) -> dict[str, np.ndarray]:
        """Run `model` on `inputs` (name -> array-like); the outputs by name (all, or `outputs`)."""
        headers, body = encode_request(inputs, outputs, priority, timeout_us, datatypes, request_id)
        try:
            resp = self._http.post(f"{_path(model, version)}/infer", content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise InferError(0, f"{type(exc).__name__}: {exc}") from None
        return decode_response(resp.status_code, resp.headers, resp.content)

    def ready(self, model: str | None = None) -> bool:
        """The server (or `model`) is ready to serve."""
        path = f"{_path(model, '')}/ready" if model else "/v2/health/ready"
        try:
            return self._http.get(path).status_code == 200
        except httpx.HTTPError:
            return False

    def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's KServe metadata: name, versions, platform, inputs and outputs."""
        try:
            return _json(self._http.get(_path(model, version)))
        except httpx.HTTPError as exc:
            raise InferError(0, f"{type(exc).__name__}: {exc}") from None

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """asyncio client: any number of requests in flight over the pool's connections."""

    def __init__(
        self,
        url: str = "http://localhost:8000",
        timeout_s: float = 10.0,
        api_key: str = "",
        max_connections: int = 64,
    ) -> None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self._http = httpx.AsyncClient(
            base_url=url, timeout=timeout_s, headers=_headers(api_key), limits=limits
        )

    async def infer(
        self,
        model: str,
        inputs: Mapping[str, Any],
        *,
        outputs: Sequence[str] = (),
        priority: int = 0,
        timeout_us: int = 0,
        datatypes: Mapping[str, str] | None = None,
        version: str = "",
        request_id: str | None = None,
    ) -> dict[str, np.ndarray]:
        headers, body = encode_request(inputs, outputs, priority, timeout_us, datatypes, request_id)
        try:
            resp = await self._http.post(f"{_path(model, version)}/infer", content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise InferError(0, f"{type(exc).__name__}: {exc}") from None
        return decode_response(resp.status_code, resp.headers, resp.content)

    async def ready(self, model: str | None = None) -> bool:
        path = f"{_path(model, '')}/ready" if model else "/v2/health/ready"
        try:
            return (await self._http.get(path)).status_code == 200
        except httpx.HTTPError:
            return False

    async def metadata(self, model: str, version: str = "") -> dict[str, Any]:
        try:
            return _json(await self._http.get(_path(model, version)))
        except httpx.HTTPError as exc:
            raise InferError(0, f"{type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
