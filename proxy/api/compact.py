"""POST /v1/responses/compact (design.md 8.8): the conversation summarised by the model, as
Codex and openai-agents compact a history that no longer fits."""

from __future__ import annotations

import time
from typing import Any

import msgspec
from aiohttp import web

from ..appkeys import REQUEST_ID, RUNTIME
from ..responses import compaction
from ..responses.body import load_json
from ..responses.lifecycle import new_id
from ..responses.plan import plan_call
from ..responses.schema import Message, parse_request
from ..responses.translate import ResponseTranslator
from .body import read_body
from .common import find_target, json_response, upstream_headers
from .responses import CHAT_PATH, call_session, translation_settings
from .stored import read_history

# What the summary's call leaves out of the conversation's chat request: the model writes text.
_NOT_FOR_A_SUMMARY = ("tools", "tool_choice", "parallel_tool_calls", "response_format", "logprobs", "top_logprobs")


async def compact(request: web.Request) -> web.Response:
    runtime = request.app[RUNTIME]
    data = load_json(await read_body(request), runtime.config.requests.max_depth)
    if isinstance(data, dict):  # what the call answers decides these (a summary, not kept)
        data = {**data, "stream": False, "store": False, "background": False, "include": None}
    parsed = parse_request(data)
    target, client = find_target(request, parsed.model)
    past = await read_history(request, parsed)
    call = plan_call(past.request, translation_settings(target, runtime.sealer), stored=False)
    chat = {key: value for key, value in call.chat.items() if key not in _NOT_FOR_A_SUMMARY}
    chat["messages"] = [*chat["messages"], {"role": "user", "content": compaction.PROMPT}]
    session = call_session(request, past) if client.keyed else None
    async with client.post(CHAT_PATH, chat, upstream_headers(request), session=session) as exchange:
        body = await exchange.read_body()
    answer = ResponseTranslator(call, streaming=False, request_id=request[REQUEST_ID]).complete(body)
    texts = [part for item in answer["output"] if item["type"] == "message" for part in item["content"]]
    summary = "".join(part["text"] for part in texts if part["type"] == "output_text")
    items = past.request.input
    said = [Message(role="user", content=items)] if isinstance(items, str) else items
    users = [_kept(item) for item in said if isinstance(item, Message) and item.role == "user"]
    made = compaction.compacted(users, summary, runtime.sealer, new_id, int(time.time()), answer["usage"])
    return json_response(made)


def _kept(message: Message) -> dict[str, Any]:
    """A user message as the compacted output lists it: typed, its text in parts."""
    content = message.content
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else msgspec.to_builtins(content)
    return {"id": new_id("msg"), "type": "message", "role": "user", "content": parts}
