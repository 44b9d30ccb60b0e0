"""The operator's MCP policy where a request tries to get past it (design.md 14.1, 14.2): a
`server_url` read as the HTTP client sends it, the addresses a client-named server may have, and
the headers that reach an operator's server; through the real proxy and a real MCP server from
the official SDK, which records the paths and headers it received."""

from __future__ import annotations

import ipaddress
from typing import Any

import aiohttp
import pytest

from proxy.upstream.mcp import _internal
from tests.client import create
from tests.fake_upstream import FakeUpstream, Generation, Reply, Step, score
from tests.harness import config
from tests.mcp_servers import ToolServer


def calling(name: str, arguments: str) -> Generation:
    step = Step("tool", arguments, [score(arguments)], tool_index=0, tool_id="call_1", tool_name=name)
    return Generation([step, Step("finish", finish_reason="tool_calls", scores=[score("<call>")])])


def answering(text: str) -> Generation:
    return Generation([Step("text", text, [score(text)]), Step("finish", finish_reason="stop", scores=[score("<eos>")])])


def named(url: str, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "x", "server_url": url, "require_approval": "never", **fields}


# -- server_url: the path as sent (14.1) ---------------------------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/ok/../mcp",
        "/ok/./../mcp",
        "/ok/x/../../mcp",
        "/ok/%2e%2e/mcp",
        "/ok/%2E%2e/mcp",
        "/ok/.%2e/mcp",
        "/ok/..%2fmcp",
        "/ok/%252e%252e/mcp",  # decoded twice by some servers
        "/ok/..;/mcp",  # a segment's parameters dropped by some servers
        "/ok/..%5cmcp",  # a backslash read as a slash by some servers
    ],
)
async def test_a_dot_segment_cannot_leave_the_path_an_entry_allows(
    path: str, upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": [f"{tool_server.base_url}/ok/*"]}))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [named(tool_server.base_url + path)]})
    assert status == 400 and body["error"]["param"] == "tools[0].server_url", body
    assert tool_server.paths == [] and upstream.requests == []


async def test_the_url_matched_is_the_url_connected_to(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    """`/x/../mcp` is sent as `/mcp` by the HTTP client: that is what an entry is matched against."""
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": [f"{tool_server.base_url}/m*"]}))
    upstream.script(Reply(answering("hi")))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [named(f"{tool_server.base_url}/x/../mcp")]})
    assert status == 200, body
    assert tool_server.paths and set(tool_server.paths) == {"/mcp"}


@pytest.mark.parametrize(
    "url",
    [
        "http://[::1",
        "http://[::1]x/mcp",
        "http://[zz::1]/mcp",
        "http://a\uff03b.example/mcp",  # full-width #
        "http://a\uff0fb.example/mcp",  # full-width /
        "http://a\uff20b.example/mcp",  # full-width @
        "http://\uff45xample.com/mcp",  # full-width e
        "http://h:abc/mcp",
        "http://h:99999/mcp",
        "http://h:0/mcp",
        "http://h:-1/mcp",
        "http:///mcp",
        "http://",
        "http://h/\x00",
        "http://h\t/mcp",
        f"http://{'a' * 64}.example/mcp",  # a label longer than DNS takes
        f"http://h/{'x' * 70000}",
    ],
)
async def test_a_server_url_that_does_not_parse_is_a_400_before_any_contact(
    url: str, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://*", "http://*:*", "http://*/*", "http://*:*/*"]}))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [{"type": "function", "name": "f"}, named(url)]})
    assert status == 400 and body["error"]["param"] == "tools[1].server_url", body
    assert upstream.requests == []


# -- the addresses a client-named server may have (14.1) ------------------------------------------


@pytest.mark.parametrize(
    "address",
    [
        "127.0.0.1",
        "0.0.0.0",
        "0.1.2.3",  # 0.0.0.0/8, "this network"
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "100.64.0.1",  # shared address space (carrier-grade NAT)
        "100.100.100.200",  # Alibaba's metadata service
        "169.254.169.254",  # the metadata service of most clouds
        "168.63.129.16",  # Azure's host endpoint
        "192.0.0.1",  # 192.0.0.0/24, IETF protocol assignments
        "192.0.0.9",  # its PCP anycast, answered by the local gateway
        "198.18.0.1",
        "240.0.0.1",
        "255.255.255.255",
        "224.0.0.1",
        "::",
        "::1",
        "fe80::1",
        "fc00::1",
        "fd00:ec2::254",  # AWS's metadata service over IPv6
        "fec0::1",  # site-local
        "ff02::1",
        "::ffff:127.0.0.1",  # IPv4-mapped
        "::ffff:10.0.0.1",
        "::127.0.0.1",  # IPv4-compatible, deprecated, whatever it carries
        "::8.8.8.8",
        "2002:7f00:1::",  # 6to4 of 127.0.0.1
        "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
        "64:ff9b::7f00:1",  # NAT64, the well-known prefix, of 127.0.0.1
        "64:ff9b::a9fe:a9fe",
        "64:ff9b:1::808:808",  # the local-use NAT64 prefix, whatever it carries
        "2001::1",  # Teredo, whatever it carries
        "2001:0:4136:e378:8000:63bf:3fff:fdd2",
        "2001:db8::1",
        "100::1",
    ],
)
def test_an_address_that_is_not_public_is_internal(address: str) -> None:
    assert _internal(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::", "64:ff9b::808:808"],
)
def test_a_public_address_is_not_internal_also_inside_an_ipv6_one(address: str) -> None:
    assert not _internal(ipaddress.ip_address(address))


@pytest.mark.parametrize(
    "host",
    ["0.1.2.3", "10.1.2.3", "168.63.129.16", "192.0.0.8", "[::127.0.0.1]", "[64:ff9b:1::a00:1]", "[2001::1]", "[fec0::1]"],
)
async def test_a_client_named_server_behind_a_wildcard_is_refused_on_an_address_that_is_not_public(
    host: str, upstream: FakeUpstream, start_proxy, http: aiohttp.ClientSession
) -> None:
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": ["http://*:*/mcp"], "timeout": 2}))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [named(f"http://{host}:9/mcp")]})
    assert status == 424 and "internal address" in body["error"]["message"], body
    assert upstream.requests == []


# -- an operator server's headers (14.2) ------------------------------------------------------------


def values(received: list[tuple[str, str]], name: str) -> list[str]:
    return [value for key, value in received if key.lower() == name]


@pytest.mark.parametrize(
    "credential",
    [{"authorization": "op-token"}, {"authorization_file": None}, {"headers": {"authorization": "Bearer op-token"}}],
)
async def test_a_client_header_spelled_otherwise_never_joins_or_replaces_the_operators(
    credential: dict[str, Any], upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession, tmp_path
) -> None:
    if "authorization_file" in credential:
        token = tmp_path / "token"
        token.write_text("op-token\n")
        credential = {"authorization_file": str(token)}
    headers = {**credential.pop("headers", {}), "X-Tenant": "ops"}
    operator = {"server_label": "ops", "url": tool_server.url, "headers": headers, **credential}
    proxy = await start_proxy(config(upstream.url, mcp={"servers": [operator]}))
    forged = {"AUTHORIZATION": "Bearer CLIENT-FORGED", "x-tenant": "evil", "X-TENANT": "evil", "X-Extra": "client"}
    tools = [{"type": "mcp", "server_label": "ops", "require_approval": "never", "headers": forged, "authorization": "ALSO-FORGED"}]
    upstream.script(Reply(calling("ops__echo", '{"text": "hi"}')), Reply(answering("ok")))
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": tools})
    assert status == 200 and body["output"][1]["output"] == "hi", body
    assert len(tool_server.raw_headers) >= 3  # the listing's connection and the call's, each several requests
    for received in tool_server.raw_headers:
        assert values(received, "authorization") == ["Bearer op-token"], received
        assert values(received, "x-tenant") == ["ops"], received
        assert values(received, "x-extra") == ["client"], received  # a header the operator does not set still goes


async def test_a_client_named_server_gets_one_authorization(
    upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    """The tool's `authorization` is its `Authorization` header, whatever the case of one in its `headers`."""
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))
    upstream.script(Reply(answering("ok")))
    tool = named(tool_server.url, headers={"authorization": "Bearer from-headers"}, authorization="from-field")
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": [tool]})
    assert status == 200, body
    assert tool_server.raw_headers
    assert all(values(received, "authorization") == ["Bearer from-field"] for received in tool_server.raw_headers)


@pytest.mark.parametrize("name", ["Host", "content-length", "Transfer-Encoding", "Connection"])
async def test_a_client_never_sets_the_headers_of_the_connection_itself(
    name: str, upstream: FakeUpstream, tool_server: ToolServer, start_proxy, http: aiohttp.ClientSession
) -> None:
    """A `Host` would send the request to another virtual host than the entry admitted; a
    `Content-Length` would cut the connection's messages where the body does not end."""
    proxy = await start_proxy(config(upstream.url, mcp={"allowed_servers": [tool_server.url]}))
    tools = [named(tool_server.url, headers={name: "admin.internal" if name == "Host" else "1"})]
    status, body = await create(http, proxy, {"model": "m", "input": "hi", "tools": tools})
    assert status == 400 and body["error"]["param"] == "tools[0].headers", body
    assert tool_server.paths == [] and upstream.requests == []
