"""POST /v1/responses/compact (design.md 8.8): a turn that asks for its conversation's summary,
run by the turn layer, answered whole."""

from __future__ import annotations

from aiohttp import web

from ..appkeys import RUNTIME
from ..responses.body import load_json
from ..turns.rounds import Asks
from .body import read_body
from .common import Whole, json_response, plan


async def compact(request: web.Request) -> web.Response:
    """The conversation's user messages, then its summary, sealed."""
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    if isinstance(data, dict):  # what the call answers decides these (a summary, not kept)
        data = {**data, "stream": False, "store": False, "background": False, "include": None}
    turn = await plan(request, data, Asks.COMPACTION)
    return json_response(await turn.run(Whole()))
