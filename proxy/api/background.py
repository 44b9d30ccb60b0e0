"""Background responses over HTTP (design.md 10): starting one, following its events from any
point, cancelling it."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import orjson
from aiohttp import web

from ..appkeys import OWNER, RUNTIME
from ..background import BackgroundRuns
from ..errors import InvalidRequest
from ..responses.lifecycle import DONE, RUNNING, is_terminal, running
from ..turns.turn import Turn
from .common import json_response, stored_of
from .streaming import KEEPALIVE, SSE_HEADERS, cut_short_on_failure


def runs_of(request: web.Request) -> BackgroundRuns:
    runs = request.app[RUNTIME].background
    if runs is None:
        raise InvalidRequest(
            "A background response needs a store, and this proxy keeps none (store: none).", param="background"
        )
    return runs


async def start(request: web.Request, turn: Turn) -> web.StreamResponse:
    """A turn planned to run in the background (it is stored, design.md 10.1), run: its queued
    response, or its events followed. Where the run never starts, the turn is let go (its
    conversation's hold); once it does, the run holds the turn to its end, whatever becomes of
    this request (9.7). A stream's place among the key's followers is taken first: past the cap,
    nothing runs."""
    runs, owner, record = runs_of(request), request[OWNER], turn.keeping.record
    assert record is not None  # a background turn is stored
    with contextlib.ExitStack() as following:
        try:
            if turn.call.stream:
                following.enter_context(runs.following(owner))
            queued = await runs.start(turn, record, owner)
        except BaseException:
            await turn.release()
            raise
        return await _follow(request, runs, queued["id"], -1) if turn.call.stream else json_response(queued)


async def follow(request: web.Request, id: str, after: int) -> web.StreamResponse:
    """The response's events past sequence number `after`, as they were first written, then
    the live ones to its end: from any replica (design.md 10.2)."""
    runs = runs_of(request)
    with runs.following(request[OWNER]):
        return await _follow(request, runs, id, after)


async def _follow(request: web.Request, runs: BackgroundRuns, id: str, after: int) -> web.StreamResponse:
    store, owner = runs.store, request[OWNER]
    wait = request.app[RUNTIME].config.keepalive or 15.0
    events = await _resumed(runs, owner, id, after)  # before the stream begins: its errors are answers
    response = web.StreamResponse(headers=SSE_HEADERS)
    await response.prepare(request)
    with cut_short_on_failure(request):
        if events is None:
            await response.write_eof(DONE)
            return response
        while True:
            if not events:
                events = await store.events(id, after, wait, owner)
            if not events:
                await response.write(KEEPALIVE)
                await runs.end_if_lost(id, owner)  # its holder may have died meanwhile
                if await _ended_by(runs, owner, id, after):
                    await response.write_eof(DONE)
                    return response
                continue
            after = events[-1][0]
            data = b"".join(event + b"\n\n" for _, event in events)
            if is_terminal(events[-1][1]):
                await response.write_eof(data + DONE)  # in one write (design.md 4.10)
                return response
            await response.write(data)
            events = []
    return response


async def _resumed(runs: BackgroundRuns, owner: str, id: str, after: int) -> list[tuple[int, bytes]] | None:
    """The events past `after` kept so far, read from `after` itself in the same read: None
    when the response ended there or before, so that a client that saw its terminal event
    follows on to nothing but `[DONE]` (design.md 10.2)."""
    if after < 0:
        return []
    events = await runs.store.events(id, after - 1, 0)
    if not events:  # past its last event: nothing more comes unless it still runs
        return None if (await _reread(runs, owner, id))["status"] not in RUNNING else []
    if events[0][0] == after:
        return None if is_terminal(events[0][1]) else events[1:]
    return events


async def _ended_by(runs: BackgroundRuns, owner: str, id: str, after: int) -> bool:
    """Whether the response ended at or before event `after`: one followed from past its end
    while it ran may end below that number (design.md 10.2). Its status says so first; its
    terminal event, kept just after, is the proof."""
    if (await _reread(runs, owner, id))["status"] in RUNNING:
        return False
    made = await runs.store.events(id, -1, 0)
    return bool(made) and made[-1][0] <= after and is_terminal(made[-1][1])


async def cancel_and_wait(runs: BackgroundRuns, owner: str, response: dict[str, Any]) -> dict[str, Any] | None:
    """Cancel a running background response and wait, up to a lease, for its run to end
    (design.md 10.3): the Response as it ended, its terminal event kept; None if it did not end
    in time."""
    await runs.cancel(response["id"])
    # The run ends itself, at once here, within a third of a lease on another replica. Its
    # final Response is kept before its terminal event (9.2): the event says both are.
    loop = asyncio.get_running_loop()
    deadline = loop.time() + runs.settings.lease
    after = -1
    while True:
        made = await runs.store.events(response["id"], after, 0)
        if made:
            after = made[-1][0]
            if is_terminal(made[-1][1]):
                return await _reread(runs, owner, response["id"])
        if loop.time() >= deadline:
            return None
        await asyncio.sleep(0.05)


async def current(runs: BackgroundRuns, owner: str, response: dict[str, Any]) -> dict[str, Any]:
    """A background response as it stands: if its run was lost, ended first."""
    if running(response) and await runs.end_if_lost(response["id"], owner):
        return await _reread(runs, owner, response["id"])
    return response


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/responses/{id}/cancel, as OpenAI answers it: a synchronous or finished
    response cannot be; a cancelled one is answered again (design.md 10.3)."""
    runs, owner = runs_of(request), request[OWNER]
    response = await current(runs, owner, await _reread(runs, owner, request.match_info["id"]))
    status = response["status"]
    if not response.get("background"):
        raise InvalidRequest("Cannot cancel a synchronous response.", param="response_id")
    if status in ("completed", "failed", "incomplete"):
        raise InvalidRequest(f"Cannot cancel a response that is already {status}.", param="response_id")
    if status != "cancelled":
        response = await cancel_and_wait(runs, owner, response) or await _reread(runs, owner, response["id"])
    return json_response(response)


async def _reread(runs: BackgroundRuns, owner: str, id: str) -> dict[str, Any]:
    return dict(orjson.loads(bytes((await stored_of(runs.store, owner, id)).response)))
