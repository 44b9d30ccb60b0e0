"""POST /v1/responses/input_tokens (the SDKs' `responses.input_tokens.count`, design.md 8.12):
the tokens the call's chat request would take, counted by the upstream's own tokenizer with its
chat template."""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from ..appkeys import RUNTIME
from ..errors import NotImplementedHere, ProxyError, UpstreamProtocolError
from ..responses.body import load_json
from .body import read_body
from .calls import Turn, plan_turn
from .common import json_response


async def count(request: web.Request) -> web.Response:
    data = load_json(await read_body(request), request.app[RUNTIME].config.requests.max_depth)
    if isinstance(data, dict):  # counted, never answered, kept or run
        data = {**data, "stream": False, "store": False, "background": False}
    turn = await plan_turn(request, data, writes=False)
    return json_response({"object": "response.input_tokens", "input_tokens": await _counted(request, turn)})


async def _counted(request: web.Request, turn: Turn) -> int:
    upstream, chat = turn.target.upstream, turn.call.chat
    dialect = upstream.wire()
    messages: dict[str, Any] = {key: chat[key] for key in ("messages", "tools") if key in chat}
    if dialect.tokenizer == "chat":
        answer = await _post(
            request, turn, dialect.tokenize_path, {"model": chat["model"], **messages, "add_generation_prompt": True}
        )
        counted = answer.get("count")
    elif dialect.tokenizer == "template":
        rendered = await _post(request, turn, "/apply-template", messages)
        answer = await _post(
            request, turn, dialect.tokenize_path, {"content": rendered.get("prompt"), "add_special": True}
        )
        counted = len(answer["tokens"]) if isinstance(answer.get("tokens"), list) else None
    else:
        raise NotImplementedHere(
            f"The upstream {upstream.name} ({upstream.dialect}) has no tokenizer endpoint to count tokens with; "
            "give it the dialect of its server (sglang, vllm, llama.cpp).",
            param="model",
        )
    if not isinstance(counted, int):
        raise UpstreamProtocolError(f"upstream {upstream.name} answered its tokenizer without a count")
    return counted


async def _post(request: web.Request, turn: Turn, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        async with turn.post(request, body, path) as exchange:
            answer = orjson.loads(await exchange.read_body())
    except ProxyError as error:
        if error.status in (404, 405):
            raise NotImplementedHere(
                f"The upstream {turn.target.upstream.name} has no {path} to count tokens with.", param="model"
            ) from None
        raise
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError(f"upstream {turn.target.upstream.name} answered {path} with no JSON") from None
    if not isinstance(answer, dict):
        raise UpstreamProtocolError(f"upstream {turn.target.upstream.name} answered {path} with no JSON object")
    return answer
