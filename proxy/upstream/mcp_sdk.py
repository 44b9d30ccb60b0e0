"""An MCP operation over the official `mcp` SDK (design.md 14): a connection of its own over
streamable HTTP (or the older SSE transport), guarded (no internal address unless the operator
named it, no redirect) and bounded in bytes, a server's tools listed, a tool called, and what a
failure shows. Imported once a request uses an MCP server, never by a plain start (2.6): the SDK
brings its server side (starlette, pydantic, anyio) with it."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import httpcore2
import httpx2
import mcp_types as types
import orjson
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH

from ..config import Mcp
from .mcp import Endpoint, McpFailure, _http_error, _internal, _protocol_error

log = logging.getLogger("proxy")
T = TypeVar("T")
Slot = AbstractAsyncContextManager[None]


async def list_tools(endpoint: Endpoint, config: Mcp, slot: Slot) -> list[dict[str, Any]]:
    """The server's tools, every page, as an `mcp_list_tools` item lists them (design.md 14.3)."""

    async def every_page(client: Client) -> list[Any]:
        tools, cursor = [], None
        while True:  # the pages' bytes are one answer's, within max_output_bytes (14.7)
            page = await client.list_tools(cursor=cursor, cache_mode="bypass")
            tools += page.tools
            cursor = page.next_cursor
            if cursor is None:
                return tools

    return [_listed(tool) for tool in await _run(endpoint, config, slot, every_page)]


async def call(endpoint: Endpoint, config: Mcp, slot: Slot, name: str, arguments: dict[str, Any]) -> str:
    """A tool's output as text (design.md 14.4)."""
    request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=arguments))

    async def calling(client: Client) -> types.CallToolResult:
        # Sent by the session, not `Client.call_tool`: that one lists the tools again to check
        # the result against the tool's output schema, on the event loop, where a hostile
        # server's schema (a backtracking pattern) could hold it for minutes (design.md 14.4).
        try:
            return await client.session.send_request(request, types.CallToolResult)
        except MCPError as error:
            if error.code != HEADER_MISMATCH:
                raise
        await client.list_tools(cache_mode="bypass")  # the tool's headers, as a 2026-07-28 server wants
        return await client.session.send_request(request, types.CallToolResult)

    result = await _run(endpoint, config, slot, calling)
    if result.is_error:
        content = [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
        raise McpFailure({"type": "mcp_tool_execution_error", "content": content})
    texts = [block.text for block in result.content if block.type == "text"]
    if texts or result.structured_content is None:
        return "\n".join(texts)
    return orjson.dumps(result.structured_content).decode()


async def _run(endpoint: Endpoint, config: Mcp, slot: Slot, operation: Callable[[Client], Awaitable[T]]) -> T:
    """One operation on a connection of its own, within the key's share of calls and the
    operation's time: over streamable HTTP, or the older SSE transport where the server
    refuses streamable HTTP's first POST (design.md 14.1); every way it can fail an
    `McpFailure`."""
    # What the server sends in all, over every request of the operation (its pages, a
    # reconnected stream): what a hostile one can cost (14.7).
    budget = _Budget(config.max_output_bytes)
    try:
        async with asyncio.timeout(config.timeout), slot:  # design.md 14.7
            try:
                return await _connected(endpoint, config, budget, operation, sse=False)
            except Exception as exc:
                if not isinstance(_leaf(exc), _NotStreamable):
                    raise
            return await _connected(endpoint, config, budget, operation, sse=True)
    except Exception as exc:  # the SDK's, httpx's and the server's failures, often grouped
        if budget.left < 0:  # whatever the SDK made of it
            raise McpFailure(_too_large()) from None
        if isinstance(_leaf(exc), TimeoutError):
            raise McpFailure(_http_error(504, f"The MCP server did not answer within {config.timeout:g} s.")) from None
        raise McpFailure(_failure(exc)) from None


async def _connected(
    endpoint: Endpoint, config: Mcp, budget: _Budget, operation: Callable[[Client], Awaitable[T]], sse: bool
) -> T:
    headers = endpoint.request_headers()

    def http(*_: Any, **__: Any) -> httpx2.AsyncClient:
        guarded = _Guarded(endpoint.internal, budget, streamable=not sse)
        return httpx2.AsyncClient(headers=headers, timeout=config.timeout, transport=guarded)

    transport = sse_client(endpoint.url, httpx_client_factory=http) if sse else _streamable(endpoint.url, http())
    async with Client(transport, cache=None) as client:
        return await operation(client)


@contextlib.asynccontextmanager
async def _streamable(url: str, http: httpx2.AsyncClient) -> AsyncIterator[Any]:
    async with http, streamable_http_client(url, http_client=http) as streams:
        yield streams


def _listed(tool: Any) -> dict[str, Any]:
    listed: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema, "description": tool.description}
    if tool.annotations is not None:
        listed["annotations"] = tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
    return listed


def _leaf(exc: BaseException) -> BaseException:
    """What went wrong, where the SDK raised it as an exception group of its task groups."""
    while isinstance(exc, BaseExceptionGroup):
        exc = exc.exceptions[0]
    return exc


def _failure(exc: BaseException) -> dict[str, Any]:
    """The error a failed operation shows, from what the SDK raised."""
    exc = _leaf(exc)
    if isinstance(exc, McpFailure):
        return exc.error
    if isinstance(exc, MCPError):
        return _protocol_error(exc.code, exc.error.message)
    if isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        if 300 <= status < 400:
            return _http_error(status, "The MCP server answered with a redirect, which the proxy does not follow.")
        return _http_error(status, f"The MCP server answered HTTP {status}.")
    if isinstance(exc, httpx2.TimeoutException):
        return _http_error(504, "The MCP server did not answer in time.")
    if isinstance(exc, httpx2.TransportError | OSError):
        return _http_error(502, f"The MCP server could not be reached, or broke off: {type(exc).__name__}.")
    log.warning("an MCP operation failed in an unforeseen way", exc_info=exc)
    return _protocol_error(-32603, f"The MCP exchange failed: {type(exc).__name__}.")


# Made once: loading the CA bundle for each connection's context costs ~25 ms of the event loop.
_TLS = httpx2.create_ssl_context()


class _Budget:
    """The bytes an operation's answers may still take."""

    __slots__ = ("left",)

    def __init__(self, most: int) -> None:
        self.left = most


class _Guarded(httpx2.AsyncBaseTransport):
    """Every HTTP request of an MCP connection: connected to no internal address unless the
    operator named it (checked at the connection, on the address it connects to), no redirect
    followed, no answer past the operation's budget (design.md 14.1, 14.7)."""

    def __init__(self, internal: bool, budget: _Budget, streamable: bool) -> None:
        self._inner = httpx2.AsyncHTTPTransport(verify=_TLS)
        if not internal:  # its pool connects through the check
            self._inner._pool = httpcore2.AsyncConnectionPool(ssl_context=_TLS, network_backend=_Checked())
        self._budget = budget
        self._first_post = streamable  # only the first POST's refusal says "not streamable HTTP"

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if request.method == "POST" and self._first_post:
            self._first_post = False
            if response.status_code in (404, 405):
                await response.aclose()
                raise _NotStreamable
        if response.is_redirect:
            await response.aclose()
            raise McpFailure(
                _http_error(response.status_code, "The MCP server answered with a redirect, which is not followed.")
            )
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._budget.left:
            await response.aclose()
            self._budget.left = -1
            raise McpFailure(_too_large())
        response.stream = _Capped(response.stream, self._budget)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _NotStreamable(Exception):
    """A server that refuses streamable HTTP's POST: one of the older SSE transport."""


class _Capped(httpx2.AsyncByteStream):
    def __init__(self, stream: Any, budget: _Budget) -> None:
        self._stream, self._budget = stream, budget

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._stream:
            self._budget.left -= len(chunk)
            if self._budget.left < 0:
                raise McpFailure(_too_large())
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


class _Checked(httpcore2.AsyncNetworkBackend):
    """Connections made to an address checked once: the name resolved here is the address
    connected to, so that a second answer of its DNS (rebinding) cannot point elsewhere."""

    def __init__(self) -> None:
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore2.AsyncNetworkStream:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        addresses = [str(address[0]) for *_, address in found]
        if not addresses or any(_internal(ipaddress.ip_address(address)) for address in addresses):
            raise McpFailure(
                _http_error(403, f"The MCP server's host {host} is an internal address the operator has not named.")
            )
        return await self._inner.connect_tcp(addresses[0], port, timeout, local_address, socket_options)

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def _too_large() -> dict[str, Any]:
    return _http_error(413, "The MCP server's answer is larger than the proxy takes (mcp.max_output_bytes).")
