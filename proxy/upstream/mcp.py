"""Remote MCP servers, as the proxy calls them (design.md 14): which one a request's tool names
and whether it may (14.1), its tools listed (14.3) and a tool called (14.4), through the
official `mcp` SDK over streamable HTTP (or its older SSE transport), each operation bounded in
time, in size and in calls per key, never following a redirect."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import ipaddress
import logging
import re
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import httpcore2
import httpx2
import mcp_types as types
import orjson
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import HEADER_MISMATCH

from ..config import HostedTool, Mcp, McpServer
from ..errors import InvalidRequest, McpUnavailable
from ..limits import PerKey
from ..responses.mcp import BUILTIN_KINDS, Builtin, McpTool

log = logging.getLogger("proxy")
T = TypeVar("T")

# What `ipaddress` calls global (or, as Python versions differ, may) that reaches the host's own
# network all the same: the IETF's protocol assignments (their PCP and TURN anycast answered by the
# local gateway), Azure's host endpoint (a cloud's host service, as the metadata address is), the
# local-use NAT64 prefix and the deprecated site-local one (design.md 14.1).
_NOT_PUBLIC = [
    ipaddress.ip_network(network) for network in ("192.0.0.0/24", "168.63.129.16/32", "64:ff9b:1::/48", "fec0::/10")
]
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # the well-known prefix, an IPv4 address in its last 32 bits
_GLOB = set("*?[")
# The headers of the connection itself and of its messages' framing: a client's `Host` would reach
# another virtual host than the one admitted, its `Content-Length` cut the messages elsewhere (14.2).
_CONNECTION_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "upgrade", "te"}


@dataclass(frozen=True, slots=True)
class Endpoint:
    """An MCP server as one request reaches it: its URL and the headers that go to it alone."""

    label: str
    url: str
    headers: Mapping[str, str]
    # Whether it may be on an address that is not public (loopback, private, metadata...): the
    # operator named it.
    internal: bool
    description: str | None = None
    token_file: str | None = None  # a bearer token read at each connection: a rotated secret applies at once

    def request_headers(self) -> dict[str, str]:
        """Its headers as a connection sends them; an unreadable token file fails the operation."""
        if self.token_file is None:
            return dict(self.headers)
        try:
            token = Path(self.token_file).read_text().strip()
        except OSError:
            raise McpFailure(_http_error(401, "The operator's credential for this server cannot be read.")) from None
        return _merged(self.headers, {"Authorization": f"Bearer {token}"})


class McpFailure(Exception):
    """An MCP operation that failed, as the `error` of its `mcp_call` (design.md 14.4)."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error["message"] if "message" in error else error["type"])
        self.error = error


class McpServers:
    """The operator's MCP policy (config `mcp:`), and every MCP operation of the process."""

    def __init__(self, config: Mcp) -> None:
        self.config = config
        self._by_label = {server.server_label: server for server in config.servers}
        self._by_connector = {server.connector_id: server for server in config.servers if server.connector_id}
        self._per_key = PerKey(config.max_calls_per_key)

    def endpoint(self, tool: McpTool, index: int) -> Endpoint:
        """The server a request's tool names, where the operator lets clients reach it; else a
        400 naming the field, and the server is never contacted (design.md 14.1)."""
        connection = _CONNECTION_HEADERS.intersection(name.lower() for name in tool.headers or ())
        if connection:
            raise InvalidRequest(
                f"The header '{connection.pop()}' is the HTTP connection's own: a request cannot set it.",
                param=f"tools[{index}].headers",
            )
        if tool.server_url is None:
            server = self._by_connector.get(tool.connector_id) if tool.connector_id else None
            server = server or self._by_label.get(tool.server_label)
            if server is None:
                raise InvalidRequest(
                    f"The MCP server '{tool.server_label}' is not one this proxy defines: give its 'server_url'.",
                    param=f"tools[{index}].server_url",
                )
            return self.operator_endpoint(server, tool)
        try:
            url = _sent(tool.server_url)
        except ValueError as exc:
            raise InvalidRequest(
                f"The MCP server URL is not valid: {exc}", param=f"tools[{index}].server_url"
            ) from None
        allowed = [pattern for pattern in self.config.allowed_servers if _allows(pattern, url)]
        if not allowed:
            raise InvalidRequest(
                f"The MCP server '{tool.server_url}' is not one this proxy's operator allows (mcp.allowed_servers).",
                param=f"tools[{index}].server_url",
            )
        internal = any(_GLOB.isdisjoint(urlsplit(pattern).netloc) for pattern in allowed)
        return Endpoint(tool.server_label, str(url), _client_headers(tool), internal, tool.server_description)

    def builtin(self, kind: str) -> tuple[Builtin, Endpoint] | None:
        """The operator's MCP tool that answers a built-in tool type, if it maps one (14.8)."""
        mapped = BUILTIN_KINDS.get(kind)
        hosted: HostedTool | None = getattr(self.config, mapped) if mapped else None
        if mapped is None or hosted is None:
            return None
        return Builtin(mapped, hosted.server, hosted.tool), self.operator_endpoint(self._by_label[hosted.server])

    def operator_endpoint(self, server: McpServer, tool: McpTool | None = None) -> Endpoint:
        # The operator's headers win over the client's, whatever their case: a server that reads
        # the first of two trusts what came first (design.md 14.2).
        operators = {"Authorization": f"Bearer {server.authorization}"} if server.authorization else {}
        headers = _merged(_client_headers(tool), server.headers, operators)
        description = (tool.server_description if tool is not None else None) or server.description
        return Endpoint(server.server_label, server.url, headers, True, description, server.authorization_file)

    async def list_tools(self, endpoint: Endpoint, owner: str) -> list[dict[str, Any]]:
        """The server's tools, as an `mcp_list_tools` item lists them; a server that cannot list
        them is OpenAI's 424 (design.md 14.3)."""

        async def every_page(client: Client) -> list[Any]:
            tools, cursor = [], None
            while True:  # the pages' bytes are one answer's, within max_output_bytes (14.7)
                page = await client.list_tools(cursor=cursor, cache_mode="bypass")
                tools += page.tools
                cursor = page.next_cursor
                if cursor is None:
                    return tools

        try:
            tools = await self._run(endpoint, owner, every_page)
        except McpFailure as failure:
            raise McpUnavailable(
                f"Error retrieving tool list from MCP server: '{endpoint.label}'. {failure}", param="tools"
            ) from None
        return [_listed(tool) for tool in tools]

    async def call(self, endpoint: Endpoint, owner: str, name: str, arguments: str) -> str:
        """A tool's output as text; its failure, of any kind, an `McpFailure` (design.md 14.4)."""
        try:
            parsed = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as exc:
            raise McpFailure(_protocol_error(-32602, f"The arguments are not JSON: {exc}")) from None
        if not isinstance(parsed, dict):
            raise McpFailure(_protocol_error(-32602, "The arguments are not a JSON object."))
        request = types.CallToolRequest(params=types.CallToolRequestParams(name=name, arguments=parsed))

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

        result = await self._run(endpoint, owner, calling)
        if result.is_error:
            content = [block.model_dump(mode="json", by_alias=True, exclude_none=True) for block in result.content]
            raise McpFailure({"type": "mcp_tool_execution_error", "content": content})
        texts = [block.text for block in result.content if block.type == "text"]
        if texts or result.structured_content is None:
            output = "\n".join(texts)
        else:
            output = orjson.dumps(result.structured_content).decode()
        return output

    async def _run(self, endpoint: Endpoint, owner: str, operation: Callable[[Client], Awaitable[T]]) -> T:
        """One operation on a connection of its own, within the key's share of calls and the
        operation's time: over streamable HTTP, or the older SSE transport where the server
        refuses streamable HTTP's first POST (design.md 14.1); every way it can fail an
        `McpFailure`."""
        config = self.config
        # What the server sends in all, over every request of the operation (its pages, a
        # reconnected stream): what a hostile one can cost (14.7).
        budget = _Budget(config.max_output_bytes)
        try:
            async with asyncio.timeout(config.timeout), self._per_key.slot(owner):  # design.md 14.7
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
                raise McpFailure(
                    _http_error(504, f"The MCP server did not answer within {config.timeout:g} s.")
                ) from None
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


def _client_headers(tool: McpTool | None) -> dict[str, str]:
    """What a request sends its server alone (design.md 14.2)."""
    if tool is None:
        return {}
    return _merged(tool.headers or {}, {"Authorization": f"Bearer {tool.authorization}"} if tool.authorization else {})


def _merged(*layers: Mapping[str, str]) -> dict[str, str]:
    """Headers, one of each name whatever its case: a later layer's replaces an earlier one's."""
    merged: dict[str, tuple[str, str]] = {}
    for layer in layers:
        merged |= {name.lower(): (name, value) for name, value in layer.items()}
    return dict(merged.values())


def _listed(tool: Any) -> dict[str, Any]:
    listed: dict[str, Any] = {"name": tool.name, "input_schema": tool.input_schema, "description": tool.description}
    if tool.annotations is not None:
        listed["annotations"] = tool.annotations.model_dump(mode="json", by_alias=True, exclude_none=True)
    return listed


def _protocol_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def _http_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "http_error", "code": code, "message": message}


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


def _internal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Any address but a public unicast one (design.md 14.1); an IPv6 address that carries an
    IPv4 one (mapped, 6to4, NAT64's well-known prefix) as that IPv4 address is. An IPv4-compatible
    one is reserved, and a Teredo one not global: whatever it carries, a relay sends it on to."""
    if isinstance(ip, ipaddress.IPv6Address):
        carried = ip.ipv4_mapped or ip.sixtofour
        if carried is None and ip in _NAT64:
            carried = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
        if carried is not None:
            return _internal(carried)
    public = ip.is_global and not (ip.is_multicast or ip.is_reserved or any(ip in network for network in _NOT_PUBLIC))
    return not public


_PORTS = {"http": 80, "https": 443}


def _sent(url: str) -> httpx2.URL:
    """A `server_url` as the HTTP client sends it (its `.` and `..` segments resolved, its host
    IDNA-encoded): what an entry is matched against and what is connected to; a ValueError,
    saying why, for one that it cannot send, or whose path still has a dot segment once
    percent-decoded, which servers differ in resolving (design.md 14.1)."""
    try:
        sent = httpx2.URL(url)
    except httpx2.InvalidURL as exc:
        raise ValueError(str(exc)) from None
    if not sent.host:
        raise ValueError("it names no host")
    if sent.port is not None and not 0 < sent.port < 65536:
        raise ValueError(f"its port {sent.port} is out of range")
    sent.host.encode("idna")  # as the connection resolves it: a label DNS cannot carry is a UnicodeError
    for segment in sent.raw_path.decode("ascii").partition("?")[0].split("/"):
        while "%" in segment and (decoded := unquote(segment)) != segment:  # some servers decode twice
            segment = decoded
        # Some servers read a `\` as a `/`, and drop a segment's `;` parameters.
        if any(part.partition(";")[0] in (".", "..") for part in re.split(r"[/\\]", segment)):
            raise ValueError("its path has a '.' or '..' segment as a server may read it (percent-encoded, '..;')")
    return sent


def _allows(pattern: str, url: httpx2.URL) -> bool:
    """Whether an `allowed_servers` entry admits a URL as it is sent: its parts matched one by
    one, the host's `*` within one label (never across a `.`, a `/` or a `@`; a host of `*`
    alone: any), the path and query as sent, as `fnmatch` reads them (none: any); a URL with
    credentials in it is never admitted (design.md 14.1)."""
    want, path = urlsplit(pattern), url.raw_path.decode("ascii")
    if url.scheme not in _PORTS or url.userinfo or url.fragment:
        return False
    wanted = want.hostname or ""
    host = "[^/@]+" if wanted == "*" else re.escape(wanted).replace(r"\*", "[^./@:]*").replace(r"\?", "[^./@:]")
    try:  # a port left out is the scheme's
        port_ok = (want.port or _PORTS[want.scheme]) == (url.port or _PORTS[url.scheme])
    except (ValueError, KeyError):
        port_ok = False
    port_ok = port_ok or want.netloc.endswith(":*")
    return (
        want.scheme == url.scheme
        and re.fullmatch(host, url.host) is not None
        and port_ok
        and (not want.path or fnmatch.fnmatchcase(path, f"{want.path}?{want.query}" if want.query else want.path))
    )


def _too_large() -> dict[str, Any]:
    return _http_error(413, "The MCP server's answer is larger than the proxy takes (mcp.max_output_bytes).")
