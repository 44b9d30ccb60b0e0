"""Compaction over HTTP (design.md 8.8, 8.10): POST /v1/responses/compact, a turn whose last
input item is a `compaction_trigger`, and a turn whose conversation crossed its
`context_management` threshold, all answered by the model's summary of the conversation, as
Codex, openai-agents and the AI SDK compact a history that no longer fits."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import msgspec
from aiohttp import web

from ..appkeys import REQUEST_ID, RUNTIME
from ..errors import InvalidRequest, ProxyError
from ..relay import Compactor
from ..responses import compaction
from ..responses.body import load_json
from ..responses.lifecycle import completed, new_id, whole_stream
from ..responses.plan import plan_call
from ..responses.schema import Message, parse_items
from ..responses.translate import ResponseTranslator
from .body import read_body
from .calls import Turn, plan_turn, translation_settings
from .common import json_response
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
log = logging.getLogger("proxy")


async def compact(request: web.Request) -> web.Response:
    """POST /v1/responses/compact: the conversation's user messages, then its summary, sealed."""
    runtime = request.app[RUNTIME]
    data = load_json(await read_body(request), runtime.config.requests.max_depth)
    if isinstance(data, dict):  # what the call answers decides these (a summary, not kept)
        data = {**data, "stream": False, "store": False, "background": False, "include": None}
    turn = await plan_turn(request, data, writes=False)
    summary, usage = await _summarised(request, turn)
    users = [_kept(item) for item in turn.past.request.items() if isinstance(item, Message) and item.role == "user"]
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


def compactor(request: web.Request, turn: Turn) -> Compactor:
    """The compaction of a turn whose conversation, its answer included, crossed its
    `context_management` threshold (design.md 8.10). A summary that fails is logged, and the
    answer completes without it: the turn's own tokens are whole."""

    async def compact_after(output: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
        try:
            summary, usage = await _summarised(request, turn, output)
        except Exception as error:  # whatever failed, the answer stays whole; the unforeseen logged whole
            foreseen = error.message if isinstance(error, ProxyError) else None
            log.warning(
                "a compaction after its turn failed: %s",
                foreseen or repr(error),
                exc_info=foreseen is None,
                extra={"request_id": request[REQUEST_ID]},
            )
            return None
        return compaction.compaction_item(summary, request.app[RUNTIME].sealer, new_id), usage

    return compact_after


async def _summarised(
    request: web.Request, turn: Turn, output: list[dict[str, Any]] | None = None
) -> tuple[str, dict[str, Any]]:
    """The model's summary of the conversation, this turn's `output` after it (one
    non-streaming chat call: the conversation, then the compaction prompt), and that call's
    usage."""
    chat = {key: value for key, value in turn.call.chat.items() if key not in _NOT_FOR_A_SUMMARY}
    chat["stream"] = False
    said = _with_output(request, turn, output) if output else chat["messages"]
    chat["messages"] = [*said, {"role": "user", "content": compaction.PROMPT}]
    async with turn.post(request, chat) as exchange:
        body = await exchange.read_body()
    call = dataclasses.replace(turn.call, compact_at=None)
    answer = ResponseTranslator(call, streaming=False, request_id=request[REQUEST_ID]).complete(body)
    assert answer is not None  # a call that compacts nothing ends
    texts = [part for item in answer["output"] if item["type"] == "message" for part in item["content"]]
    return "".join(part["text"] for part in texts if part["type"] == "output_text"), answer["usage"]


def _with_output(request: web.Request, turn: Turn, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of the turn's conversation with its answer after it, planned as the
    next turn would send them."""
    past = turn.past.request
    whole = msgspec.structs.replace(past, input=[*past.items(), *parse_items(output)])
    planned = plan_call(whole, translation_settings(turn.target, request.app[RUNTIME].sealer))
    messages: list[dict[str, Any]] = planned.chat["messages"]
    return messages


def _kept(message: Message) -> dict[str, Any]:
    """A user message as the compacted output lists it: typed, its text in parts."""
    content = message.content
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else msgspec.to_builtins(content)
    return {"id": new_id("msg"), "type": "message", "role": "user", "content": parts}
