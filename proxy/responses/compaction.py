"""Compaction (design.md 8.8): a conversation too long for the model's context, rewritten by
the model as a summary that the next turns carry in a `compaction` item, sealed. Pure: the turn
layer makes the summary's chat call and hands its answer in (`turns/compaction.py`)."""

from __future__ import annotations

from typing import Any

import msgspec

from .lifecycle import IdSource
from .native import ToolSearchCall
from .schema import (
    TOOL_CALLS,
    TOOL_OUTPUTS,
    Compaction,
    CompactionTrigger,
    ConfigurationUpdate,
    CreateResponse,
    HostedTool,
    InputItem,
    Message,
    ToolSearchOutput,
    answered,
)
from .sealing import Sealer

# Asked of the model after the conversation, as the last user message: what the agent that
# continues needs, since everything else is gone once the history is replaced.
PROMPT = (
    "Your context is nearly full. Write a summary of the conversation so far, for the assistant "
    "that will continue it without seeing it: the user's goals and constraints; what has been done "
    "(files read and changed, commands run, their results); the decisions made and why; what remains "
    "to do. Keep every exact name, path, value and error message needed to go on. Write only the summary."
)
# The share of the route's context window at which `context_management` compacts when its
# entry names no threshold (design.md 8.10).
DEFAULT_THRESHOLD = 0.8
# How a compaction item reads to the model when it comes back as input.
HEAD = "A summary of the conversation before this point (compacted to fit the context):\n\n"


def triggered(request: CreateResponse) -> bool:
    """Whether the request asks for its conversation compacted instead of answered: its last
    input item is a `compaction_trigger`."""
    items = request.input
    return isinstance(items, list) and bool(items) and isinstance(items[-1], CompactionTrigger)


def compaction_item(sealed: str, new_id: IdSource) -> dict[str, Any]:
    """A `compaction` item of a summary sealed as reasoning is (design.md 8.6)."""
    return {"id": new_id("cmp"), "type": "compaction", "encrypted_content": sealed}


def compacted(
    kept: list[dict[str, Any]], item: dict[str, Any], id: str, created_at: int, usage: dict[str, Any]
) -> dict[str, Any]:
    """The `response.compaction` object: the user messages and configuration updates of the
    conversation (`kept`, typed), then the `compaction` item."""
    return {
        "id": id,
        "object": "response.compaction",
        "created_at": created_at,
        "output": [*kept, item],
        "usage": usage,
    }


# What a compacted output keeps besides the user's messages, each as it was: the settings that
# apply on (design.md 8.2), the tools a search loaded and its call (8.17).
KEPT = (ConfigurationUpdate, ToolSearchCall, ToolSearchOutput)
_KEPT_PREFIXES = {ConfigurationUpdate: "cu", ToolSearchCall: "tsc", ToolSearchOutput: "tso"}


def kept_item(item: ConfigurationUpdate | ToolSearchCall | ToolSearchOutput, new_id: IdSource) -> dict[str, Any]:
    kept: dict[str, Any] = {"id": new_id(_KEPT_PREFIXES[type(item)]), **msgspec.to_builtins(item)}
    if isinstance(item, ToolSearchOutput):  # a tool the proxy drops, as its client sent it
        kept["tools"] = [
            tool.sent if isinstance(tool, HostedTool) else msgspec.to_builtins(tool) for tool in item.tools
        ]
    if not isinstance(item, ConfigurationUpdate):
        kept["status"] = "completed"
    return kept


def summary_of(blob: str, sealer: Sealer | None) -> str | None:
    """The summary a `compaction` item carries: sealed by this proxy, or another server's plain
    text (as peers write it), the text itself; None for a blob that does not open (an old key's,
    tampered) or is no text (OpenAI's own, one token of base64)."""
    opened = sealer.open(blob) if sealer is not None else None
    if opened is not None:
        return opened
    return None if Sealer.sealed(blob) or not any(c.isspace() for c in blob) else blob


def threshold(request: CreateResponse, context_window: int | None) -> int | None:
    """The tokens (the turn's input and output) past which a turn's conversation is compacted
    after its answer (design.md 8.10): its `context_management` compaction entry's threshold,
    else a share of the route's context window; None: no compaction."""
    for entry in request.context_management or ():
        if entry.type == "compaction":
            if entry.compact_threshold is not None:
                return entry.compact_threshold
            return int(context_window * DEFAULT_THRESHOLD) if context_window else None
    return None


def since_compaction(items: list[InputItem], sealer: Sealer | None) -> list[InputItem]:
    """What the model is sent of a conversation with a readable `compaction` item (design.md
    8.8): from the last one on, and before it only the user, system and developer messages,
    since its summary stands for the rest. A tool call answered after it stays, moved after
    it, so that its output follows it as chat templates need."""
    last = None
    for index, item in enumerate(items):
        if isinstance(item, Compaction) and summary_of(item.encrypted_content, sealer) is not None:
            last = index
    if last is None:
        return items
    outputs = {answered(item) for item in items[last:] if isinstance(item, TOOL_OUTPUTS)}
    before = items[:last]
    said = [item for item in before if isinstance(item, Message) and item.role != "assistant"]
    calls = [item for item in before if isinstance(item, TOOL_CALLS) and item.call_id in outputs]
    return [*said, items[last], *calls, *items[last + 1 :]]
