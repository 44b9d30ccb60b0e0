"""Compaction over HTTP (design.md 8.8): POST /v1/responses/compact, and a turn whose last input
item is a `compaction_trigger`, answered as its transport asks; the summary is the turn layer's
(`turns.compaction`)."""

from __future__ import annotations

from aiohttp import web

from ..appkeys import RUNTIME
from ..responses.body import load_json
from ..responses.lifecycle import whole_stream
from ..turns import compaction
from ..turns.turn import Turn
from .body import read_body
from .common import json_response, plan
from .streaming import EventStream


async def compact(request: web.Request) -> web.Response:
    """POST /v1/responses/compact: the conversation's user messages, then its summary, sealed."""
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    if isinstance(data, dict):  # what the call answers decides these (a summary, not kept)
        data = {**data, "stream": False, "store": False, "background": False, "include": None}
    return json_response(await compaction.compact(await plan(request, data, writes=False)))


async def compaction_turn(request: web.Request, turn: Turn) -> web.StreamResponse:
    """`compacted_turn` over HTTP, streamed or not as the turn asked."""
    response = await compaction.compacted_turn(turn)
    if not turn.call.stream:
        return json_response(response)
    stream = EventStream()
    await stream.prepare(request)
    await stream.write_eof(whole_stream(response))
    return stream
