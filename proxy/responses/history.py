"""Stored responses as conversation history (design.md 9): what a response keeps of its input,
and the input a chained or referencing request stands for. Pure: the store's reads happen in
the turn layer (`turns/history.py`), which hands their JSON in.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson

from ..errors import InvalidRequest
from .lifecycle import RUNNING, IdSource
from .logprobs import INCLUDE_LOGPROBS
from .schema import (
    ANSWERS,
    TOOL_CALLS,
    TOOL_OUTPUTS,
    Compaction,
    CreateResponse,
    InputItem,
    ItemReference,
    ToolCall,
    ToolCallOutput,
    answered,
    parse_items,
    typed_item,
)

# The prefix of the id an input item gets when its client sent none, by its type.
_ID_PREFIXES = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "reasoning": "rs",
    "configuration_update": "cu",
}


def references(request: CreateResponse) -> list[str]:
    """The ids of the stored items the request's input refers to."""
    return [item.id for item in request.items() if isinstance(item, ItemReference)]


def expand(
    request: CreateResponse, history: list[dict[str, Any]], referenced: dict[str, dict[str, Any]]
) -> CreateResponse:
    """The request with the chain's items before its own input and its references replaced
    by the items they name; a reference the store did not have is a 400 naming it, and so is an
    output of its own input that answers no call (design.md 8.2)."""
    own_items: list[Any] = []
    for index, item in enumerate(request.items()):
        if isinstance(item, ItemReference):
            found = referenced.get(item.id)
            if found is None:
                raise InvalidRequest(
                    f"No stored item with id '{item.id}' (item_reference).", param=f"input[{index}].id"
                )
            own_items += parse_items([found])
        else:
            own_items.append(item)
    kept = parse_items(history)
    check_answers(kept, own_items)
    return msgspec.structs.replace(request, input=[*kept, *own_items])


def check_answers(kept: list[InputItem], own: list[InputItem]) -> None:
    """Each tool output of a request's own input answers a call before it, in the history
    (`kept`, whose outputs are read as kept) or the input, one of the kind it answers that no
    output answered yet; else a 400 naming it, as OpenAI answers (design.md 8.2). After a
    compaction item, an output whose call is nowhere may answer one that the item stands for."""
    waiting: dict[str, list[type[ToolCall]]] = {}  # by call id: a model may give two calls one id
    done: set[str] = set()
    compacted = False
    for index, item in enumerate([*kept, *own]):
        if isinstance(item, Compaction):
            compacted = True
        elif isinstance(item, TOOL_CALLS):
            waiting.setdefault(item.call_id, []).append(type(item))
        elif isinstance(item, TOOL_OUTPUTS):
            call_id = answered(item)
            calls = waiting.get(call_id)
            made, twice = calls.pop(0) if calls else None, call_id in done
            fits = made in ANSWERS[type(item)] if made else bool(call_id) and compacted and not twice
            done.add(call_id)
            if not fits and index >= len(kept):
                raise _unanswered(item, made, index - len(kept), twice, own)


def _unanswered(
    output: ToolCallOutput, made: type[ToolCall] | None, index: int, twice: bool, own: list[InputItem]
) -> InvalidRequest:
    where, call_id = f"input[{index}]", answered(output)
    if not call_id:
        return InvalidRequest(f"Missing '{where}.call_id': the id of the call it answers.", param=f"{where}.call_id")
    said = f"No tool call found for {str(output.__struct_config__.tag).replace('_', ' ')} with call_id {call_id}"
    if made is not None:
        said += f": {call_id} is a {made.__struct_config__.tag}"
    elif twice:
        said += ": that call is answered by an earlier output"
    elif any(isinstance(item, TOOL_CALLS) and item.call_id == call_id for item in own[index:]):
        said += ": an output follows its call"
    return InvalidRequest(f"{said}.", param=where)


def chain_items(records: list[tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    """The items of a chain of stored responses, oldest first: each response's input, then its
    output (design.md 9.4). `records` holds each response's (input items, Response) JSON."""
    items: list[dict[str, Any]] = []
    for input_items, response in records:
        made = orjson.loads(response)
        if made["status"] in RUNNING:
            # Its output so far is a turn cut short, which its end would then replace.
            raise InvalidRequest(
                f"The response '{made['id']}' is still running: continue from it once it has ended.",
                param="previous_response_id",
            )
        items += orjson.loads(input_items)
        items += made["output"]
    return items


def with_status(item: dict[str, Any]) -> dict[str, Any]:
    """A kept message with a `status`, which the SDK's conversation `Message` requires: a
    message a client sent is whole. Read back too: messages kept before they had one."""
    if item.get("type") == "message" and item.get("status") is None:
        item["status"] = "completed"
    return item


def stored_input(data_input: Any, referenced: dict[str, dict[str, Any]], new_id: IdSource) -> list[dict[str, Any]]:
    """A request's own input as the response keeps it and `input_items` lists it: every item
    with an id, messages in their typed form, references replaced by what they named."""
    if isinstance(data_input, str):
        data_input = [{"role": "user", "content": data_input}]
    kept = []
    for item in data_input or ():
        item = dict(typed_item(item))
        if item["type"] == "item_reference":
            kept.append(referenced[item["id"]])
            continue
        if item["type"] == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        with_status(item)
        if item.get("id") is None:
            item["id"] = new_id(_ID_PREFIXES.get(item["type"], "item"))
        kept.append(item)
    return kept


def shown(response: dict[str, Any], include: list[str]) -> dict[str, Any]:
    """A stored Response as it is read back: its scores only when `include` asks for them,
    as on the request that made it (design.md 9.3)."""
    if INCLUDE_LOGPROBS not in include:
        for item in response["output"]:
            for part in item.get("content") or ():
                if part.get("type") == "output_text":
                    part["logprobs"] = []
    return response


def page(
    items: list[dict[str, Any]], *, order: str, after: str | None, before: str | None, limit: int
) -> dict[str, Any]:
    """One page of a response's input items, in the list envelope `input_items` answers with:
    `order` "desc" lists the last item first; `after` and `before` are item ids of the list in
    that order (a cursor that names no item is a 400 naming it)."""
    ordered = items[::-1] if order == "desc" else items
    ids = [item["id"] for item in ordered]
    start, end = 0, len(ordered)
    for param, cursor in (("after", after), ("before", before)):
        if cursor is not None and cursor not in ids:
            raise InvalidRequest(f"No input item with id '{cursor}'.", param=param)
    if after is not None:
        start = ids.index(after) + 1
    if before is not None:
        end = ids.index(before)
    data = ordered[start:end][:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": start + len(data) < end,
    }
