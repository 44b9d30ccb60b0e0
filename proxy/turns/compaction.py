"""Compaction (design.md 8.8, 8.10): the model's summary of a turn's conversation, asked in one
non-streaming chat call, for `/v1/responses/compact`, a turn that ends with a
`compaction_trigger`, and the round that ends a turn past its `context_management` threshold."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import msgspec

from ..errors import InvalidRequest
from ..responses import compaction
from ..responses.lifecycle import completed, new_id, response_id
from ..responses.native import ToolSearchCall
from ..responses.plan import plan_call
from ..responses.schema import ConfigurationUpdate, Message, ToolSearchOutput, parse_items
from ..responses.translate import ResponseTranslator
from .turn import Turn, translation_settings

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


async def compact(turn: Turn) -> dict[str, Any]:
    """`/v1/responses/compact` of a turn planned to write nothing: the conversation's user
    messages, then its summary, sealed (design.md 8.8)."""
    summary, usage = await summarised(turn)
    past = turn.past.request.items()
    kept = [
        _kept(item)
        for item in past
        if isinstance(item, compaction.KEPT) or (isinstance(item, Message) and item.role == "user")
    ]
    item = compaction.compaction_item(summary, turn.runtime.sealer, new_id)
    return compaction.compacted(kept, item, new_id("resp"), int(time.time()), usage)


async def compacted_turn(turn: Turn) -> dict[str, Any]:
    """A turn that ends with a `compaction_trigger`, answered by exactly one `compaction` item
    and kept as any turn is: the Response."""
    if turn.call.background:
        raise InvalidRequest(
            "A compaction_trigger turn is answered at once, never in the background.", param="background"
        )
    summary, usage = await summarised(turn)
    item = compaction.compaction_item(summary, turn.runtime.sealer, new_id)
    response = completed(
        response_id(turn.call.echo),
        int(time.time()),
        [item],
        turn.call.echo,
        usage,
    )
    await turn.keep(response)
    return response


async def summarised(turn: Turn, output: list[dict[str, Any]] | None = None) -> tuple[str, dict[str, Any]]:
    """The model's summary of the conversation, this turn's `output` after it (one
    non-streaming chat call: the conversation, then the compaction prompt), and that call's
    usage."""
    chat = {key: value for key, value in turn.call.chat.items() if key not in _NOT_FOR_A_SUMMARY}
    chat["stream"] = False
    said = _with_output(turn, output) if output else chat["messages"]
    chat["messages"] = [*said, {"role": "user", "content": compaction.PROMPT}]
    async with turn.post(chat) as exchange:
        body = await exchange.read_body()
    call = dataclasses.replace(turn.call, compact_at=None)
    answer = ResponseTranslator(call, streaming=False, request_id=turn.caller.request_id).complete(body)
    assert answer is not None  # a call that compacts nothing ends
    texts = [part for item in answer["output"] if item["type"] == "message" for part in item["content"]]
    return "".join(part["text"] for part in texts if part["type"] == "output_text"), answer["usage"]


def _with_output(turn: Turn, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of the turn's conversation with its answer after it, planned as the
    next turn would send them."""
    past = turn.past.request
    whole = msgspec.structs.replace(past, input=[*past.items(), *parse_items(output)])
    planned = plan_call(whole, translation_settings(turn.target, turn.runtime.sealer))
    messages: list[dict[str, Any]] = planned.chat["messages"]
    return messages


def _kept(message: Message | ConfigurationUpdate | ToolSearchCall | ToolSearchOutput) -> dict[str, Any]:
    """A user message as the compacted output lists it: typed, its text in parts; another item
    it keeps as it was (`compaction.KEPT`)."""
    if not isinstance(message, Message):
        return compaction.kept_item(message, new_id)
    content = message.content
    parts = [{"type": "input_text", "text": content}] if isinstance(content, str) else msgspec.to_builtins(content)
    return {"id": new_id("msg"), "type": "message", "role": "user", "content": parts}
