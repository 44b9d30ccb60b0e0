"""Self-check of the MCP test servers, through the real MCP SDK client."""

from __future__ import annotations

import asyncio
import time

import httpx2
import mcp
import pytest
from mcp import MCPError
from mcp.client.sse import sse_client
from mcp.client.streamable_http import streamable_http_client

from tests.mcp_servers import HANDSHAKE_VERSION, HUGE_BYTES, TOOL_NAMES, HostileServer, ToolServer, search_text

# Until conftest imports them.

LIMIT = 3  # seconds: no test may hang
CONNECT = ["server/discover", "initialize", "notifications/initialized"]
PARSE_ERROR, INVALID_REQUEST, INTERNAL_ERROR = -32700, -32600, -32603


def leaves(group: BaseException) -> list[BaseException]:
    if isinstance(group, BaseExceptionGroup):
        return [leaf for e in group.exceptions for leaf in leaves(e)]
    return [group]


async def test_lists_the_tools_with_annotations(tool_server: ToolServer):
    async with asyncio.timeout(LIMIT), mcp.Client(tool_server.url) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert sorted(tools) == sorted(TOOL_NAMES)
    assert tools["add"].description == "Add two integers."
    for name in ("add", "echo", "search"):
        annotations = tools[name].annotations
        assert annotations is not None
        assert annotations.read_only_hint is True
    delete = tools["delete_item"].annotations
    assert delete is not None
    assert (delete.read_only_hint, delete.destructive_hint) == (False, True)
    assert tools["add"].input_schema["required"] == ["a", "b"]
    assert tool_server.list_requests == 1


async def test_calls_are_answered_and_recorded(tool_server: ToolServer):
    async with asyncio.timeout(LIMIT), mcp.Client(tool_server.url) as client:
        added = await client.call_tool("add", {"a": 2, "b": 3})
        found = await client.call_tool("search", {"query": "cats"})
        big = await client.call_tool("big", {"size": 10})
        slept = await client.call_tool("sleep", {"seconds": 0.01})
    assert not added.is_error
    assert added.content[0].text == "5"  # type: ignore[union-attr]
    assert added.structured_content == {"result": 5}
    assert found.content[0].text == search_text("cats")  # type: ignore[union-attr]
    assert big.content[0].text == "x" * 10  # type: ignore[union-attr]
    assert slept.content[0].text == "slept"  # type: ignore[union-attr]
    assert tool_server.calls[0] == ("add", {"a": 2, "b": 3})
    assert [name for name, _ in tool_server.calls] == ["add", "search", "big", "sleep"]


async def test_a_failing_tool_gives_an_error_result(tool_server: ToolServer):
    async with asyncio.timeout(LIMIT), mcp.Client(tool_server.url) as client:
        result = await client.call_tool("fail", {"message": "boom"})
    assert result.is_error
    assert result.content[0].text == "Error executing tool fail: boom"  # type: ignore[union-attr]
    assert tool_server.calls == [("fail", {"message": "boom"})]


async def test_records_request_headers(tool_server: ToolServer):
    async with (
        asyncio.timeout(LIMIT),
        httpx2.AsyncClient(headers={"X-Test-Trace": "abc"}) as http,
        mcp.Client(streamable_http_client(tool_server.url, http_client=http)) as client,
    ):
        await client.call_tool("echo", {"text": "hi"})
    assert tool_server.headers
    assert all(h.get("x-test-trace") == "abc" for h in tool_server.headers)
    # The default (auto) client speaks 2026-07-28, which names each request's method in a header;
    # it lists the tools after a call to a tool it had not listed, for the output schema.
    assert [h.get("mcp-method") for h in tool_server.headers] == ["server/discover", "tools/call", "tools/list"]


async def test_legacy_handshake(tool_server: ToolServer):
    async with asyncio.timeout(LIMIT), mcp.Client(tool_server.url, mode="legacy") as client:
        assert client.protocol_version == HANDSHAKE_VERSION
        result = await client.call_tool("echo", {"text": "old"})
    assert result.content[0].text == "old"  # type: ignore[union-attr]


async def test_sse_endpoint(tool_server: ToolServer):
    async with asyncio.timeout(LIMIT), mcp.Client(sse_client(tool_server.sse_url)) as client:
        names = [tool.name for tool in (await client.list_tools()).tools]
        result = await client.call_tool("echo", {"text": "over sse"})
    assert sorted(names) == sorted(TOOL_NAMES)
    assert result.content[0].text == "over sse"  # type: ignore[union-attr]
    assert tool_server.calls == [("echo", {"text": "over sse"})]


@pytest.mark.parametrize("mode", ["slow", "huge", "invalid", "garbage", "disconnect", "redirect", "error_status"])
async def test_hostile_lists_before_misbehaving(hostile_server, mode: str):
    server: HostileServer = await hostile_server(mode)
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        assert client.protocol_version == HANDSHAKE_VERSION  # discover refused: fell back to initialize
        tools = (await client.list_tools()).tools
    assert [tool.name for tool in tools] == ["work"]
    assert server.requests == [*CONNECT, "tools/list"]


async def test_hostile_slow_call_times_out(hostile_server):
    server: HostileServer = await hostile_server("slow")
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        await client.list_tools()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await client.call_tool("work", {})
        assert time.monotonic() - started < 1
        # The client survives the cancelled call; its own read timeout gives an MCPError instead.
        with pytest.raises(MCPError, match="timed out"):
            await client.call_tool("work", {}, read_timeout_seconds=0.2)
        assert [tool.name for tool in (await client.list_tools(cache_mode="bypass")).tools] == ["work"]
    assert server.requests.count("tools/call") == 2


@pytest.mark.parametrize("mode", ["invalid", "garbage"])
async def test_hostile_invalid_body_is_a_parse_error(hostile_server, mode: str):
    server: HostileServer = await hostile_server(mode)
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("work", {})
        assert caught.value.error.code == PARSE_ERROR
        await client.list_tools(cache_mode="bypass")  # the session is still usable


async def test_hostile_invalid_listing(hostile_server):
    server: HostileServer = await hostile_server("invalid", on="tools/list")
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        with pytest.raises(MCPError) as caught:
            await client.list_tools()
    assert caught.value.error.code == PARSE_ERROR
    assert server.requests == [*CONNECT, "tools/list"]


async def test_hostile_error_status(hostile_server):
    server: HostileServer = await hostile_server("error_status")
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("work", {})
    assert caught.value.error.code == INTERNAL_ERROR


async def test_hostile_redirect_is_not_followed(hostile_server):
    decoy: HostileServer = await hostile_server("error_status")  # another origin: another port
    server: HostileServer = await hostile_server("redirect", redirect_to=decoy.url)
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        await client.list_tools()
        with pytest.raises(MCPError) as caught:
            await client.call_tool("work", {})
    assert caught.value.error.code == INVALID_REQUEST
    assert "not followed" in caught.value.error.message
    assert decoy.requests == []


async def test_hostile_redirect_to_metadata_address(hostile_server):
    server: HostileServer = await hostile_server("redirect", on="tools/list")
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        with pytest.raises(MCPError, match=r"169\.254\.169\.254"):
            await client.list_tools()


async def test_hostile_disconnect_tears_the_client_down(hostile_server):
    server: HostileServer = await hostile_server("disconnect")
    # The transport's POST task dies with the read error, which ends the whole client.
    with pytest.raises(BaseExceptionGroup) as caught:
        async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
            await client.list_tools()
            await client.call_tool("work", {})
    assert [type(e) for e in leaves(caught.value)] == [httpx2.RemoteProtocolError]
    assert server.requests == [*CONNECT, "tools/list", "tools/call"]


async def test_hostile_huge_body_is_read_whole(hostile_server):
    server: HostileServer = await hostile_server("huge")
    async with asyncio.timeout(LIMIT), mcp.Client(server.url) as client:
        await client.list_tools()
        result = await client.call_tool("work", {})
    # The SDK client has no cap on a JSON response: all 50 MB arrive.
    assert HUGE_BYTES - 200 < len(result.content[0].text) < HUGE_BYTES  # type: ignore[union-attr]
