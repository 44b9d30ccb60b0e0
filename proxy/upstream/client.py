"""The upstream side: one pooled HTTP client per configured upstream.

Failures become the proxy's error types here, in one place: a refused or reset connection
before any answer is `UpstreamUnreachable` (502), a timeout `UpstreamTimeout` (504), an error
status `UpstreamError` with the upstream's own message (SGLang's flat `{"object": "error"}`
body and the OpenAI nested one alike).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import orjson

from ..config import UpstreamConfig
from ..errors import ProxyError, UpstreamError, UpstreamTimeout, UpstreamUnreachable

_MAX_ERROR_BODY = 64 * 1024


class UpstreamClient:
    def __init__(self, config: UpstreamConfig) -> None:
        self.config = config
        self._timeouts = config.timeouts
        headers = {"Content-Type": "application/json", **config.headers}
        key = config.key()
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=config.max_connections, limit_per_host=0, keepalive_timeout=60),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeouts.connect),
            auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )
        self._url = config.urls[0].rstrip("/")

    async def close(self) -> None:
        await self._session.close()

    @asynccontextmanager
    async def post(self, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> AsyncIterator[aiohttp.ClientResponse]:
        """POST and yield the response once its headers arrived with a 2xx status.

        Leaving the block before the body's end (a client gone, an error) closes the
        connection, which is how SGLang and vLLM learn to stop generating; a body read to its
        end returns the connection to the pool.
        """
        data = body if isinstance(body, bytes) else orjson.dumps(body)
        timeouts = self._timeouts
        try:
            async with asyncio.timeout(timeouts.first_byte):
                response = await self._session.post(self._url + path, data=data, headers=headers)
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamUnreachable(f"upstream {self.config.name} unreachable: {exc}") from None
        except TimeoutError:
            raise UpstreamTimeout(f"upstream {self.config.name} sent no answer in {timeouts.first_byte:g} s") from None
        try:
            if response.status >= 400:
                raise await _error_from(response)
            yield response
        finally:
            response.release()

    async def read_body(self, response: aiohttp.ClientResponse) -> bytes:
        return await self._guard(response.read(), self._timeouts.first_byte)

    async def read_chunk(self, response: aiohttp.ClientResponse) -> bytes:
        """The next bytes of a streaming body (b"" at its end), within the idle timeout."""
        return await self._guard(response.content.readany(), self._timeouts.idle)

    async def get(self, path: str) -> tuple[int, bytes]:
        try:
            async with asyncio.timeout(self._timeouts.connect + self._timeouts.idle):
                async with self._session.get(self._url + path) as response:
                    return response.status, await response.read()
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable(f"upstream {self.config.name} unreachable: {exc}") from None
        except TimeoutError:
            raise UpstreamTimeout(f"upstream {self.config.name} did not answer {path}") from None

    async def _guard(self, read, timeout: float) -> bytes:
        try:
            async with asyncio.timeout(timeout):
                return await read
        except aiohttp.ClientError as exc:
            raise UpstreamUnreachable(f"upstream {self.config.name} broke off: {exc!r}") from None
        except TimeoutError:
            raise UpstreamTimeout(f"upstream {self.config.name} sent nothing for {timeout:g} s") from None


async def _error_from(response: aiohttp.ClientResponse) -> ProxyError:
    try:
        body = await response.content.read(_MAX_ERROR_BODY)
    except aiohttp.ClientError:
        body = b""
    message, param = _error_message(body)
    status = response.status if response.status < 500 else 502
    return UpstreamError(status, message or f"upstream answered {response.status} {response.reason}", param=param)


def _error_message(body: bytes) -> tuple[str, str | None]:
    """The message of SGLang's flat error body, an OpenAI-style nested one, or plain text."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode(errors="replace").strip()[:1000], None
    if isinstance(data, dict):
        error = data.get("error") if isinstance(data.get("error"), dict) else data
        message, param = error.get("message"), error.get("param")
        if message:
            return str(message), param if isinstance(param, str) else None
        if isinstance(data.get("detail"), (str, list)):  # FastAPI's own validation errors
            return str(data["detail"]), None
    return body.decode(errors="replace")[:1000], None
