"""Compaction over HTTP (design.md 8.8): POST /v1/responses/compact, and a turn whose last
input item is a `compaction_trigger`, both answered by the model's summary of the conversation,
as Codex and openai-agents compact a history that no longer fits."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from ..appkeys import REQUEST_ID, RUNTIME
from ..errors import InvalidRequest
from ..responses import compaction
from ..responses.body import load_json
from ..responses.lifecycle import completed, new_id, whole_stream
from ..responses.schema import Message
from ..responses.translate import ResponseTranslator
from .body import read_body
from .calls import CHAT_PATH, Turn, plan_turn
from .common import json_response, upstream_headers
from .streaming import EventStream

# What the summary's call leaves out of the conversation's chat request: the model writes text,
# all of it at once.
_NOT_FOR_A_SUMMARY = (
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "logprobs",
    "top_logprobs",
    "stream_options",
)


async def compact(request: web.Request) -> web.Response:
    """POST /v1/responses/compact: the conversation's user messages, then its summary, sealed."""
    runtime = request.app[RUNTIME]
    data = load_json(await read_body(request), runtime.config.requests.max_depth)
    if isinstance(data, dict):  # what the call answers decides these (a summary, not kept)
        data = {**data, "stream": False, "store": False, "background": False, "include": None}
    turn = await plan_turn(request, data)
    summary, usage = await _summarised(request, turn)
    items = turn.past.request.input
    said = [Message(role="user", content=items)] if isinstance(items, str) else items
    users = [_kept(item) for item in said if isinstance(item, Message) and item.role == "user"]
    item = compaction.compaction_item(summary, runtime.sealer, new_id)
    return json_response(compaction.compacted(users, item, new_id("resp"), int(time.time()), usage))


async def compacted_turn(request: web.Request, turn: Turn) -> dict[str, Any]:
    """A turn that ends with a `compaction_trigger`, answered by exactly one `compaction` item
    and kept as any turn is: the Response."""
    if turn.call.background:
        raise InvalidRequest(
            "A compaction_trigger turn is answered at once, never in the background.", param="background"
        )
    summary, usage = await _summarised(request, turn)
    item = compaction.compaction_item(summary, request.app[RUNTIME].sealer, new_id)
    response = completed(new_id("resp"), int(time.time()), [item], turn.call.echo, usage)
    await turn.keep(response)
    return response


async def compaction_turn(request: web.Request, turn: Turn) -> web.StreamResponse:
    """`compacted_turn` over HTTP, streamed or not as the turn asked."""
    response = await compacted_turn(request, turn)
    if not turn.call.stream:
        return json_response(response)
    stream = EventStream()
    await stream.prepare(request)
    await stream.write_eof(whole_stream(response))
    return stream


async def _summarised(request: web.Request, turn: Turn) -> tuple[str, dict[str, Any]]:
    """The model's summary of the conversation (one non-streaming chat call: the conversation,
    then the compaction prompt), and that call's usage."""
    chat = {key: value for key, value in turn.call.chat.items() if key not in _NOT_FOR_A_SUMMARY}
    chat["stream"] = False
    chat["messages"] = [*chat["messages"], {"role": "user", "content": compaction.PROMPT}]
    async with turn.client.post(CHAT_PATH, chat, upstream_headers(request), session=turn.session) as exchange:
        body = await exchange.read_body()
    answer = ResponseTranslator(turn.call, streaming=False, request_id=request[REQUEST_ID]).complete(body)
    texts = [part for item in answer["output"] if item["type"] == "message" for part in item["content"]]
    return "".join(part["text"] for part in texts if part["type"] == "output_text"), answer["usage"]


def _kept(message: Message) -> dict[str, Any]:
    """A user message as the compacted output lists it: typed, its text in parts."""
    content = message.content
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else msgspec.to_builtins(content)
    return {"id": new_id("msg"), "type": "message", "role": "user", "content": parts}
