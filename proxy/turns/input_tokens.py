"""Input token counts (design.md 8.12): the tokens a turn's chat request would take, counted by
the upstream's own tokenizer with its chat template; nothing generated or kept."""

from __future__ import annotations

from typing import Any

import orjson

from ..errors import NotImplementedHere, ProxyError, UpstreamProtocolError
from .turn import Turn


async def counted(turn: Turn) -> int:
    """The tokens of the turn's chat request, by the upstream's tokenizer as its dialect says."""
    upstream, chat = turn.target.upstream, turn.call.chat
    dialect = upstream.wire()
    messages: dict[str, Any] = {key: chat[key] for key in ("messages", "tools") if key in chat}
    if dialect.tokenizer == "chat":
        reply = await _post(
            turn, dialect.tokenize_path, {"model": chat["model"], **messages, "add_generation_prompt": True}
        )
        counted = reply.get("count")
    elif dialect.tokenizer == "template":
        rendered = await _post(turn, "/apply-template", messages)
        reply = await _post(turn, dialect.tokenize_path, {"content": rendered.get("prompt"), "add_special": True})
        counted = len(reply["tokens"]) if isinstance(reply.get("tokens"), list) else None
    else:
        raise NotImplementedHere(
            f"The upstream {upstream.name} ({upstream.dialect}) has no tokenizer endpoint to count tokens with; "
            "give it the dialect of its server (sglang, vllm, llama.cpp).",
            param="model",
        )
    if not isinstance(counted, int):
        raise UpstreamProtocolError(f"upstream {upstream.name} answered its tokenizer without a count")
    return counted


async def _post(turn: Turn, path: str, body: dict[str, Any]) -> dict[str, Any]:
    try:
        async with turn.post(body, path) as exchange:
            reply = orjson.loads(await exchange.read_body())
    except ProxyError as error:
        if error.status in (404, 405):
            raise NotImplementedHere(
                f"The upstream {turn.target.upstream.name} has no {path} to count tokens with.", param="model"
            ) from None
        raise
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError(f"upstream {turn.target.upstream.name} answered {path} with no JSON") from None
    if not isinstance(reply, dict):
        raise UpstreamProtocolError(f"upstream {turn.target.upstream.name} answered {path} with no JSON object")
    return reply
