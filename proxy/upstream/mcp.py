"""Remote MCP servers, as the proxy calls them (design.md 14): which one a request's tool names
and whether it may (14.1), the headers that go to it (14.2), and the calls per key; its tools
listed (14.3) and a tool called (14.4) by `mcp_sdk`, imported only once a request uses MCP (2.6)."""

from __future__ import annotations

import fnmatch
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx2
import orjson

from ..config import HostedTool, Mcp, McpServer
from ..errors import InvalidRequest, McpUnavailable
from ..limits import PerKey
from ..responses.mcp import BUILTIN_KINDS, Builtin, McpTool

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
            found = admitted(tool.server_url, self.config.allowed_servers)
        except ValueError as exc:
            raise InvalidRequest(
                f"The MCP server URL is not valid: {exc}", param=f"tools[{index}].server_url"
            ) from None
        if found is None:
            raise InvalidRequest(
                f"The MCP server '{tool.server_url}' is not one this proxy's operator allows (mcp.allowed_servers).",
                param=f"tools[{index}].server_url",
            )
        url, internal = found
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
        from .mcp_sdk import list_tools  # the SDK, once a request uses MCP (design.md 2.6)

        try:
            return await list_tools(endpoint, self.config, self._per_key.slot(owner))
        except McpFailure as failure:
            raise McpUnavailable(
                f"Error retrieving tool list from MCP server: '{endpoint.label}'. {failure}", param="tools"
            ) from None

    async def call(self, endpoint: Endpoint, owner: str, name: str, arguments: str) -> str:
        """A tool's output as text; its failure, of any kind, an `McpFailure` (design.md 14.4)."""
        from .mcp_sdk import call  # the SDK, once a request uses MCP (design.md 2.6)

        try:
            parsed = orjson.loads(arguments or "{}")
        except orjson.JSONDecodeError as exc:
            raise McpFailure(_protocol_error(-32602, f"The arguments are not JSON: {exc}")) from None
        if not isinstance(parsed, dict):
            raise McpFailure(_protocol_error(-32602, "The arguments are not a JSON object."))
        return await call(endpoint, self.config, self._per_key.slot(owner), name, parsed)


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


def _protocol_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def _http_error(code: int, message: str) -> dict[str, Any]:
    return {"type": "http_error", "code": code, "message": message}


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


def admitted(url: str, allowed: list[str]) -> tuple[httpx2.URL, bool] | None:
    """A client's URL as it is sent, and whether it may be on an address that is not public (an
    entry that admits it names its host outright), where an entry of `allowed` admits it; None
    where none does; a ValueError, saying why, for one that cannot be sent (design.md 14.1)."""
    sent = _sent(url)
    entries = [pattern for pattern in allowed if _allows(pattern, sent)]
    if not entries:
        return None
    return sent, any(_GLOB.isdisjoint(urlsplit(pattern).netloc) for pattern in entries)


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
