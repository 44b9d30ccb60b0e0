"""Real MCP servers on loopback for the proxy's tests.

`ToolServer` is the SDK's own server (MCPServer under uvicorn) with a small tool set, serving
streamable HTTP at /mcp and the older SSE transport at /sse; it records what it received.
`HostileServer` speaks just enough streamable HTTP for the SDK client to connect and list,
then misbehaves on one method (slow, huge, invalid, garbage, disconnect, redirect, error_status,
duplicates: its one tool listed `copies` times).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import orjson
import pydantic
import pytest
import uvicorn
from aiohttp import web
from mcp.server.context import CallNext, HandlerResult, ServerRequestContext
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from starlette.types import ASGIApp, Receive, Scope, Send

READ_ONLY = ToolAnnotations(read_only_hint=True)


class Words(pydantic.BaseModel):
    text: str = pydantic.Field(pattern="^(a+)+$")

DESTRUCTIVE = ToolAnnotations(read_only_hint=False, destructive_hint=True)
TOOL_NAMES = ("add", "echo", "search", "delete_item", "fail", "big", "words", "sleep")


def id_words(n: int) -> str:
    """A catalog tool's number as one word of its own (17: `oneseven`), so that a search for it
    finds that tool alone."""
    return "".join(("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")[int(digit)] for digit in str(n))


def _record_tool(n: int) -> Callable[[str], Awaitable[str]]:
    async def record(id: str) -> str:
        return f"record {n}: {id}"

    return record


def search_text(query: str) -> str:
    """What the `search` tool answers, for tests to compare with."""
    return f"Results for {query}: 1. {query} - an overview (https://example.com/{query.replace(' ', '-')})"


class _Uvicorn(uvicorn.Server):
    def capture_signals(self) -> contextlib.AbstractContextManager[None]:  # type: ignore[override]
        # Leave SIGINT to pytest: a test's server must not swallow Ctrl-C.
        return contextlib.nullcontext()


class _Loopback:
    """A server on 127.0.0.1, its port free when it started, its MCP endpoint at /mcp."""

    _port = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    @property
    def url(self) -> str:
        return f"{self.base_url}/mcp"


class ToolServer(_Loopback):
    """The SDK's MCPServer on 127.0.0.1 (free port): streamable HTTP at `url`, SSE at `sse_url`;
    with a `catalog`, that many more read-only tools (`record_<n>`), as a large server lists."""

    def __init__(self, catalog: int = 0) -> None:
        self.catalog = catalog
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.headers: list[dict[str, str]] = []  # every HTTP request's, names lower-cased
        self.raw_headers: list[list[tuple[str, str]]] = []  # every HTTP request's, in order, duplicates kept
        self.paths: list[str] = []  # every HTTP request's path, as sent (percent-encoded)
        self.list_requests = 0
        self.sleeping = self.most_sleeping = 0  # `sleep` calls at once, now and at most
        self.mcp = self._build()
        self._uvicorn: _Uvicorn | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def sse_url(self) -> str:
        return f"{self.base_url}/sse"

    def _build(self) -> MCPServer:
        server = MCPServer("test-tools", middleware=[self._record], log_level="WARNING")

        @server.tool(description="Add two integers.", annotations=READ_ONLY)
        async def add(a: int, b: int) -> int:
            return a + b

        @server.tool(description="Echo the text back.", annotations=READ_ONLY)
        async def echo(text: str) -> str:
            return text

        @server.tool(description="Search the web.", annotations=READ_ONLY)
        async def search(query: str) -> str:
            return search_text(query)

        @server.tool(description="Delete an item.", annotations=DESTRUCTIVE)
        async def delete_item(id: str) -> str:
            return f"deleted {id}"

        @server.tool(description="Fail with the message.")
        async def fail(message: str) -> str:
            raise ToolError(message)  # the result says "Error executing tool fail: {message}"

        @server.tool(description="Return size x characters.")
        async def big(size: int) -> str:
            return "x" * size

        @server.tool(description="Words whose output schema has a backtracking pattern.", annotations=READ_ONLY)
        async def words(n: int) -> Words:
            # Its output fails the pattern only after trying every way of splitting the a's: a
            # client that checks it with a backtracking engine takes 2**n steps.
            return Words.model_construct(text="a" * n + "!")

        @server.tool(description="Sleep, then say so.")
        async def sleep(seconds: float) -> str:
            self.sleeping += 1
            self.most_sleeping = max(self.most_sleeping, self.sleeping)
            try:
                await asyncio.sleep(seconds)
            finally:
                self.sleeping -= 1
            return "slept"

        for n in range(self.catalog):
            server.add_tool(_record_tool(n), name=f"record_{n}", description=f"Read entry {id_words(n)} of the archive.", annotations=READ_ONLY)
        return server

    async def _record(self, ctx: ServerRequestContext[Any, Any], call_next: CallNext) -> HandlerResult:
        params = ctx.params or {}
        if ctx.method == "tools/call":
            self.calls.append((params.get("name", ""), dict(params.get("arguments") or {})))
        elif ctx.method == "tools/list":
            self.list_requests += 1
        return await call_next(ctx)

    def _app(self) -> ASGIApp:
        app = self.mcp.streamable_http_app()
        # One Starlette app for both transports; its lifespan runs the streamable session manager.
        app.router.routes.extend(self.mcp.sse_app().routes)

        async def recording(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                raw = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"]]
                self.raw_headers.append(raw)
                self.headers.append({k.lower(): v for k, v in raw})
                self.paths.append(scope["raw_path"].decode("latin-1"))
            await app(scope, receive, send)

        return recording

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # Accepted connections inherit it: with Nagle on (asyncio sets nothing on a socket it did
        # not make), each answer's body would wait ~40 ms for the client's delayed ACK.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app(),
            log_config=None,
            log_level="warning",
            access_log=False,
            lifespan="on",
            # Open SSE/GET streams would otherwise hold shutdown until the client leaves.
            timeout_graceful_shutdown=0.5,  # type: ignore[arg-type]  # typed int, used as a float
        )
        self._uvicorn = _Uvicorn(config)
        self._task = asyncio.create_task(self._uvicorn.serve(sockets=[sock]))
        async with asyncio.timeout(10):
            while not self._uvicorn.started:
                if self._task.done():
                    self._task.result()  # raises the startup failure
                    raise RuntimeError("uvicorn exited during startup")
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        if self._uvicorn is None or self._task is None:
            return
        self._uvicorn.should_exit = True
        try:
            async with asyncio.timeout(5):
                await asyncio.shield(self._task)
        except TimeoutError:
            self._uvicorn.force_exit = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self._uvicorn = None
        self._task = None


HostileMode = Literal[
    "slow", "huge", "huge_chunked", "invalid", "garbage", "disconnect", "redirect", "error_status", "duplicates"
]

HANDSHAKE_VERSION = "2025-11-25"
METHOD_NOT_FOUND = -32601
HUGE_BYTES = 50 * 1024 * 1024
_CHUNK = b"x" * (1024 * 1024)


_WORK = {
    "name": "work",
    "description": "Do work.",
    "inputSchema": {"type": "object", "properties": {"input": {"type": "string"}}},
}


def _result(id: Any, result: dict[str, Any]) -> web.Response:
    return web.json_response({"jsonrpc": "2.0", "id": id, "result": result})


class HostileServer(_Loopback):
    """A streamable-HTTP MCP server (JSON responses, no session id) that behaves until `on`.

    It answers the SDK client's connect (`server/discover` with METHOD_NOT_FOUND, so the
    client falls back to `initialize`; `notifications/initialized` with 202) and `tools/list`,
    then misbehaves per `mode` on every request for the method `on`.
    """

    def __init__(
        self,
        mode: HostileMode,
        *,
        on: str = "tools/call",
        delay: float = 30.0,
        redirect_to: str = "http://169.254.169.254/latest/meta-data",
        copies: int = 2,
    ) -> None:
        self.mode = mode
        self.on = on
        self.delay = delay
        self.redirect_to = redirect_to
        self.copies = copies
        self.requests: list[str] = []  # JSON-RPC methods received, in order
        self._runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/mcp", self._post)
        app.router.add_route("*", "/mcp", self._not_allowed)
        self._runner = web.AppRunner(app, handler_cancellation=True, shutdown_timeout=0.1)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = self._runner.addresses[0][1]

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _not_allowed(self, _: web.Request) -> web.Response:
        return web.Response(status=405)

    async def _post(self, request: web.Request) -> web.StreamResponse:
        message = orjson.loads(await request.read())
        method = message.get("method", "")
        self.requests.append(method)
        if "id" not in message:
            return web.Response(status=202)  # notifications, e.g. notifications/initialized
        if method == self.on:
            return await self._misbehave(request, method, message["id"])
        return self._answer(method, message["id"])

    def _answer(self, method: str, id: Any) -> web.Response:
        if method == "initialize":
            return _result(
                id,
                {
                    "protocolVersion": HANDSHAKE_VERSION,
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "hostile", "version": "0"},
                },
            )
        if method == "tools/list":
            return _result(id, {"tools": [_WORK]})
        if method == "tools/call":
            return _result(id, {"content": [{"type": "text", "text": "worked"}], "isError": False})
        # server/discover among them: refusing it sends the SDK client on to initialize.
        error = {"code": METHOD_NOT_FOUND, "message": "Method not found"}
        return web.json_response({"jsonrpc": "2.0", "id": id, "error": error})

    def _huge_frame(self, id: Any) -> tuple[bytes, bytes]:
        start = b'{"jsonrpc":"2.0","id":' + orjson.dumps(id) + b',"result":'
        if self.on == "tools/list":
            return start + b'{"tools":[{"name":"work","inputSchema":{"type":"object"},"description":"', b'"}]}}'
        return start + b'{"isError":false,"content":[{"type":"text","text":"', b'"}]}}'

    async def _misbehave(self, request: web.Request, method: str, id: Any) -> web.StreamResponse:
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
            return self._answer(method, id)
        if self.mode == "invalid":
            return web.json_response({"hello": 1})
        if self.mode == "garbage":
            return web.Response(body=b"\x00not json{{", content_type="application/json")
        if self.mode == "redirect":
            return web.Response(status=307, headers={"Location": self.redirect_to})
        if self.mode == "error_status":
            return web.Response(status=500, text="internal error")
        if self.mode == "duplicates":
            return _result(id, {"tools": [_WORK] * self.copies})
        resp = web.StreamResponse()
        resp.content_type = "application/json"
        if self.mode in ("huge", "huge_chunked"):
            # A well-formed answer, only too big: padding inside a string the result may carry;
            # chunked, its size is known only as it comes.
            head, tail = self._huge_frame(id)
            if self.mode == "huge":
                resp.content_length = HUGE_BYTES
            await resp.prepare(request)
            await resp.write(head)
            remaining = HUGE_BYTES - len(head) - len(tail)
            while remaining > 0:
                chunk = _CHUNK[: min(remaining, len(_CHUNK))]
                await resp.write(chunk)
                remaining -= len(chunk)
            await resp.write(tail)
            await resp.write_eof()
            return resp
        if self.mode == "disconnect":
            resp.content_length = 1000  # promised, never delivered
            await resp.prepare(request)
            await resp.write(b'{"jsonrpc":"2.0","id":' + orjson.dumps(id) + b',"res')
            await asyncio.sleep(0.05)  # let the part reach the client before the cut
            if request.transport is not None:
                request.transport.abort()
            return resp
        raise ValueError(f"unknown mode {self.mode!r}")


@pytest.fixture
async def tool_server() -> AsyncIterator[ToolServer]:
    server = ToolServer()
    await server.start()
    yield server
    await server.close()


@pytest.fixture
async def hostile_server() -> AsyncIterator[Callable[..., Awaitable[HostileServer]]]:
    """`await hostile_server(mode, on=..., delay=..., redirect_to=...)`: a started HostileServer."""
    servers: list[HostileServer] = []

    async def start(mode: HostileMode, **kwargs: Any) -> HostileServer:
        server = HostileServer(mode, **kwargs)
        await server.start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        await server.close()
