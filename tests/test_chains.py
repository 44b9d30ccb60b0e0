"""Chains as links (design.md 9.2, 9.4, 9.6) and references in bulk, through the real proxy on
both backends: each stored response keeps its own input and the id of the one it continues, a
chain is read in one walk however long it is, records written before links are still read, and
a request may refer to more items than one read of the store carries."""

from __future__ import annotations

import sqlite3
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import msgspec
import orjson
import pytest
import redis.asyncio

from proxy.appkeys import RUNTIME
from proxy.store import ResponseStore, StoredResponse, owner_of
from tests.client import envelope
from tests.fake_upstream import FakeUpstream, Reply
from tests.harness import Running, post
from tests.test_store import text_turn
from tests.test_websocket import one_turn

T = TypeVar("T")
# A background sweep every half lease would read the store between turns: out of the way.
QUIET = {"background": {"lease": 3600}}


class Kept:
    """A proxy's store as the backend itself keeps it: a record's bytes (SQLite's
    `length(record)`, Redis's STRLEN) and what a request sent it (SQLite's statements as its
    connection traces them, Redis's commands from clients as MONITOR shows them, those a script
    ran not counted)."""

    def __init__(self, running: Running, store: dict[str, Any]) -> None:
        kept = running.runner.app[RUNTIME].store
        assert kept is not None
        self.store: ResponseStore = kept
        url = store["url"]
        if url.startswith("redis+cluster://"):
            pytest.skip("counts what one Redis server is sent (MONITOR): test_store_cluster.py counts a cluster's")
        self._path = url.removeprefix("sqlite:") if url.startswith("sqlite:") else None
        self._redis = None if self._path else redis.asyncio.Redis.from_url(url)
        self._prefix = store.get("prefix", "")

    async def record_bytes(self, id: str) -> int:
        if self._redis is None:
            with sqlite3.connect(f"{self._path}") as db:
                return int(db.execute("SELECT length(record) FROM responses WHERE id = ?", (id,)).fetchone()[0])
        return int(await self._redis.strlen(f"{self._prefix}response:{id}"))

    async def sent(self, request: Awaitable[T]) -> tuple[T, list[str]]:
        """The request's answer, and what the store was sent meanwhile: each statement's or
        command's first word."""
        if self._redis is None:
            statements: list[str] = []
            connection = self.store.backend._connection()  # type: ignore[attr-defined]
            connection.set_trace_callback(statements.append)
            try:
                answer = await request
            finally:
                connection.set_trace_callback(None)
            return answer, [statement.split(None, 1)[0].upper() for statement in statements]
        marker = f"end-{uuid.uuid4().hex}"
        async with self._redis.monitor() as monitor:
            answer = await request
            await self._redis.echo(marker)
            commands = []
            while marker not in (command := await monitor.next_command())["command"]:
                if command["client_type"] != "lua":
                    commands.append(command["command"].split(None, 1)[0].upper())
        return answer, commands

    async def close(self) -> None:
        if self._redis is not None:
            await self._redis.aclose()


async def turn(http: aiohttp.ClientSession, url: str, text: Any, previous: str | None, headers: dict | None = None) -> dict:
    body = {"model": "m", "input": text, **({"previous_response_id": previous} if previous else {})}
    async with http.post(f"{url}/v1/responses", json=body, headers=headers) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def refused(http: aiohttp.ClientSession, url: str, body: dict, headers: dict | None = None) -> dict:
    async with http.post(f"{url}/v1/responses", json={"model": "m", **body}, headers=headers) as response:
        assert response.status == 400, await response.text()
        return envelope(await response.json())


def said(request: dict) -> list[Any]:
    return [message["content"] for message in request["messages"]]


async def test_a_long_chain_keeps_records_of_one_size_and_reads_in_as_many_round_trips(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 9.2, 9.4: the 60th turn's record is the size of the 2nd's, not that plus the
    ids of 58 responses; a turn at depth 59 sends the store what a turn at depth 10 does (one walk of
    the chain, one write), and its upstream request carries the whole chain."""
    running = await launch(store=store, **QUIET)
    kept = Kept(running, store)
    upstream.script(Reply(text_turn("ok")))
    try:
        ids: list[str] = []
        sent: dict[int, list[str]] = {}
        for i in range(60):
            made = turn(http, running.url, f"turn {i:02}", ids[-1] if ids else None)
            answer, sent[i] = await kept.sent(made)
            ids.append(answer["id"])
        assert sent[59] == sent[10] and len(sent[59]) <= 8, sent
        assert said(upstream.requests[-1]) == [text for i in range(60) for text in (f"turn {i:02}", "ok")][:-1]
        # The first names no response before it, in its link nor in its echoed
        # `previous_response_id`; every other record is of one size, the 59th's as the 1st's.
        sizes = {await kept.record_bytes(id) for id in ids[1:]}
        link, echo = f',"previous":"{ids[0]}"', f'"{ids[0]}"'
        assert len(sizes) == 1 and sizes.pop() == await kept.record_bytes(ids[0]) + len(link) + len(echo) - len("null")
    finally:
        await kept.close()


async def test_a_chain_with_a_middle_link_deleted_is_a_400_naming_it(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 9.4: a chain is continued whole or not at all; the part before the gap still is."""
    running = await launch(store=store)
    upstream.script(Reply(text_turn("ok")))
    ids: list[str] = []
    for i in range(5):
        ids.append((await turn(http, running.url, f"turn {i}", ids[-1] if ids else None))["id"])
    async with http.delete(f"{running.url}/v1/responses/{ids[2]}") as response:
        assert response.status == 200
    error = await refused(http, running.url, {"input": "more", "previous_response_id": ids[4]})
    assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
    assert ids[2] in error["message"]
    await turn(http, running.url, "from the second", ids[1])
    assert said(upstream.requests[-1]) == ["turn 0", "ok", "turn 1", "ok", "from the second"]


async def test_a_chain_does_not_run_through_another_keys_response(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 9.5: every link of a chain is the key's own. Key b's record that names key a's
    response as its link (kept by the store directly: no request makes one) is a chain cut
    there, for b; a's chain is not b's to continue."""
    running = await launch(store=store, auth={"api_keys": ["key-a", "key-b"]})
    a, b = ({"Authorization": f"Bearer key-{k}"} for k in "ab")
    upstream.script(Reply(text_turn("ok")))
    first = await turn(http, running.url, "a's secret", None, a)
    second = await turn(http, running.url, "more", first["id"], a)
    error = await refused(http, running.url, {"input": "x", "previous_response_id": second["id"]}, b)
    assert error["code"] == "previous_response_not_found" and error["param"] == "previous_response_id"
    kept = running.runner.app[RUNTIME].store
    assert kept is not None
    response = msgspec.Raw(orjson.dumps({"id": "resp_b", "status": "completed", "output": []}))
    await kept.put(StoredResponse(id="resp_b", owner=owner_of("key-b"), previous=second["id"], created_at=int(time.time()), response=response, input_items=msgspec.Raw(b"[]")))
    error = await refused(http, running.url, {"input": "x", "previous_response_id": "resp_b"}, b)
    assert error["code"] == "previous_response_not_found" and second["id"] in error["message"]
    assert all("a's secret" not in str(request) for request in upstream.requests[2:])


async def test_stored_turns_continue_a_connections_unstored_ones(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 8.9, 9.4: on a WebSocket, a stored response may continue one the connection
    keeps (whole, with its chain's items); a chain read from the store stops there. On another
    connection, that link is not stored."""
    running = await launch(store=store)
    upstream.script(Reply(text_turn("ok")))
    previous = None
    async with http.ws_connect(f"{running.url}/v1/responses") as socket:
        for i, stored in enumerate((False, False, True, True, True)):
            frame = {"type": "response.create", "model": "m", "input": f"turn {i}", "store": stored}
            events = await one_turn(socket, {**frame, **({"previous_response_id": previous} if previous else {})})
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
            if i == 1:
                unstored = previous
    assert said(upstream.requests[-1]) == [text for i in range(5) for text in (f"turn {i}", "ok")][:-1]
    error = await refused(http, running.url, {"input": "x", "previous_response_id": previous})
    assert error["code"] == "previous_response_not_found" and unstored in error["message"]


def legacy(id: str, asks: str, says: str, ancestors: list[str]) -> bytes:
    """A record as stored before links: the ids of its whole chain, no link."""
    response = {"id": id, "object": "response", "status": "completed", "output": [
        {"type": "message", "id": f"msg_{id}", "role": "assistant", "status": "completed", "content": [{"type": "output_text", "text": says, "annotations": []}]}
    ]}
    asked = [{"type": "message", "id": f"in_{id}", "role": "user", "content": [{"type": "input_text", "text": asks}]}]
    return orjson.dumps({
        "id": id, "owner": "", "created_at": int(time.time()), "response": response, "input_items": asked,
        "ancestors": ancestors, "referenced": [], "session": None, "replica": None,
    })


async def keep_legacy(store: dict[str, Any], records: dict[str, bytes]) -> None:
    """Records kept as a store before links kept them: for SQLite, in a file of that time's
    table (no column for a link), made before the proxy opens it."""
    if store["url"].startswith("sqlite:"):
        path = Path(store["url"].removeprefix("sqlite:"))
        with sqlite3.connect(path) as db:
            db.execute(
                "CREATE TABLE responses (id TEXT PRIMARY KEY, owner TEXT NOT NULL, created_at INTEGER NOT NULL, "
                "expires_at REAL NOT NULL, record BLOB NOT NULL)"
            )
            db.executemany(
                "INSERT INTO responses VALUES (?, '', ?, ?, ?)", [(id, int(time.time()), time.time() + 3600, record) for id, record in records.items()]
            )
        db.close()
        return
    if store["url"].startswith("redis+cluster://"):
        pytest.skip("a cluster's store began with links (design.md 9.9): it holds no record of before")
    client = redis.asyncio.Redis.from_url(store["url"])
    for id, record in records.items():
        await client.set(f"{store['prefix']}response:{id}", record, ex=3600)
    await client.aclose()


async def test_records_written_before_links_are_still_read(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 9.4: a record that names its whole chain (`ancestors`) is continued, and so is
    a chain of links that reaches one; one whose named response is gone is a 400 naming it. A
    SQLite file of that time gets the column of links when the proxy opens it."""
    await keep_legacy(store, {
        "resp_a": legacy("resp_a", "A asks", "A says", []),
        "resp_b": legacy("resp_b", "B asks", "B says", ["resp_a"]),
        "resp_c": legacy("resp_c", "C asks", "C says", ["resp_a", "resp_b"]),
        "resp_x": legacy("resp_x", "X asks", "X says", ["resp_a", "resp_gone"]),
    })
    running = await launch(store=store)
    upstream.script(Reply(text_turn("ok")))
    before = ["A asks", "A says", "B asks", "B says", "C asks", "C says"]
    d = await turn(http, running.url, "D asks", "resp_c")
    assert said(upstream.requests[-1]) == [*before, "D asks"]
    await turn(http, running.url, "E asks", d["id"])
    assert said(upstream.requests[-1]) == [*before, "D asks", "ok", "E asks"]
    error = await refused(http, running.url, {"input": "more", "previous_response_id": "resp_x"})
    assert error["code"] == "previous_response_not_found" and "resp_gone" in error["message"]


async def test_references_by_the_hundred_thousand_are_read_in_batches(
    upstream: FakeUpstream, launch: Callable[..., Awaitable[Running]], http: aiohttp.ClientSession, store: dict[str, Any]
) -> None:
    """design.md 9.4: 260,000 references to no stored item (12 MB, under the body limit) are
    a 400 naming the first, at once, on either backend (not a 503: more ids than SQLite binds
    in one statement); a request that refers to more items than one read carries (600, some
    twice) is answered with each of them in its place."""
    running = await launch(store=store)
    upstream.script(Reply(text_turn("ok")))
    started = time.monotonic()
    body = {"model": "m", "input": [{"type": "item_reference", "id": f"msg_{i:06}"} for i in range(260_000)]}
    status, _, raw = await post(http, running.url, body, seconds=30)
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "input[0].id"
    assert time.monotonic() - started < 10
    lines = [{"type": "message", "role": "user", "content": f"line {i}", "id": f"msg_{i:03}"} for i in range(600)]
    await turn(http, running.url, lines, None)
    references = [{"type": "item_reference", "id": f"msg_{i:03}"} for i in (*range(600), 599, 0)]
    status, _, raw = await post(http, running.url, {"model": "m", "input": references})
    assert status == 200, raw
    assert said(upstream.requests[-1]) == [f"line {i}" for i in (*range(600), 599, 0)]
    missing = [*references[:550], {"type": "item_reference", "id": "msg_nowhere"}]
    status, _, raw = await post(http, running.url, {"model": "m", "input": missing})
    assert status == 400 and envelope(orjson.loads(raw))["param"] == "input[550].id"
