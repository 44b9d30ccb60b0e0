"""POST /v1/responses/input_tokens (the SDKs' `responses.input_tokens.count`, design.md 8.12),
counted by the turn layer (`turns.input_tokens`)."""

from __future__ import annotations

from aiohttp import web

from ..appkeys import RUNTIME
from ..config import default_model
from ..responses.body import load_json
from ..turns.input_tokens import counted
from ..turns.rounds import Asks
from .body import read_body
from .common import json_response, plan


async def count(request: web.Request) -> web.Response:
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    if isinstance(data, dict):  # counted, never answered, kept or run; `model` optional, as the SDK has it
        data = {
            "model": default_model(request.app[RUNTIME].config),
            **data,
            "stream": False,
            "store": False,
            "background": False,
        }
    turn = await plan(request, data, Asks.COUNT)
    return json_response({"object": "response.input_tokens", "input_tokens": await counted(turn)})
