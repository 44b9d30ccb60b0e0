"""Compaction (design.md 8.8, 8.10): the model's summary of a turn's conversation, asked in one
non-streaming chat call, and the `compaction` item that carries it sealed: a turn that ends with
a `compaction_trigger` (its one round), the round due after a turn past its `context_management`
threshold, and `/v1/responses/compact`'s output."""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING, Any

import msgspec

from ..responses import compaction
from ..responses.lifecycle import new_id
from ..responses.native import ToolSearchCall
from ..responses.plan import plan_call
from ..responses.schema import ConfigurationUpdate, Message, ToolSearchOutput, parse_items
from ..responses.sealing import Sealer
from ..responses.translate import ResponseTranslator

if TYPE_CHECKING:  # the turn runs its compaction: the module that makes turns imports this one
    from .turn import Turn

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


async def summary(turn: Turn, output: list[dict[str, Any]] | None = None) -> tuple[str, dict[str, Any]]:
    """The summary of the turn's conversation, its `output` after it, sealed as a `compaction`
    item carries it; and the summary call's usage."""
    text, usage = await _summarised(turn, output)
    return _sealer(turn).seal(text), usage


async def compacted(turn: Turn) -> dict[str, Any]:
    """`/v1/responses/compact`'s output (a turn that keeps nothing): the conversation's user
    messages and configuration updates, then its summary, sealed (design.md 8.8)."""
    sealed, usage = await summary(turn)
    item = compaction.compaction_item(sealed, new_id)
    kept = [
        _kept(entry)
        for entry in turn.past.request.items()
        if isinstance(entry, compaction.KEPT) or (isinstance(entry, Message) and entry.role == "user")
    ]
    return compaction.compacted(kept, item, new_id("resp"), int(time.time()), usage)


async def _summarised(turn: Turn, output: list[dict[str, Any]] | None) -> tuple[str, dict[str, Any]]:
    """The model's summary of the conversation, this turn's `output` after it (one
    non-streaming chat call: the conversation, then the compaction prompt), and that call's
    usage."""
    chat = {key: value for key, value in turn.call.chat.items() if key not in _NOT_FOR_A_SUMMARY}
    chat["stream"] = False
    conversation = _with_output(turn, output) if output else chat["messages"]
    chat["messages"] = [*conversation, {"role": "user", "content": compaction.PROMPT}]
    async with turn.post(chat) as exchange:
        body = await exchange.read_body()
    call = dataclasses.replace(turn.call, compact_at=None)
    said = ResponseTranslator(call, streaming=False, request_id=turn.caller.request_id).complete(body)
    assert said is not None  # a call that compacts nothing ends
    texts = [part for item in said["output"] if item["type"] == "message" for part in item["content"]]
    return "".join(part["text"] for part in texts if part["type"] == "output_text"), said["usage"]


def _with_output(turn: Turn, output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The chat messages of the turn's conversation with its answer after it, planned as the
    next turn would send them."""
    past = turn.past.request
    whole = msgspec.structs.replace(past, input=[*past.items(), *parse_items(output)])
    planned = plan_call(whole, turn.settings)
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


def _sealer(turn: Turn) -> Sealer:
    sealer = turn.settings.sealer
    assert sealer is not None  # a turn's settings carry the runtime's
    return sealer
