"""A Response's events as they are made: numbered, encoded, and handed out as SSE in the batches
one upstream read makes (design.md 4.1, 4.2, 7.3), for the translator that decides them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from .lifecycle import DONE, encoded_event
from .mcp import opening, progress


class OpenItem:
    """An output item while it is open: its dict (shared with `output`) and its text so far."""

    __slots__ = ("index", "item", "parts", "at", "heads")

    def __init__(self, index: int, item: dict[str, Any]) -> None:
        self.index = index
        self.item = item
        self.parts: list[str] = []
        self.at = {"item_id": item["id"], "output_index": index}  # what every event on it names
        self.heads: dict[str, bytes] = {}  # delta event type -> its encoded head


def open_form(item: dict[str, Any], text: str) -> dict[str, Any]:
    """An item still being generated, with its `text` so far where its kind shows it."""
    kind = item["type"]
    if kind == "reasoning":
        return {**item, "content": [{"type": "reasoning_text", "text": text}]}
    if kind == "message":  # a refusal
        return {**item, "content": [{"type": "refusal", "refusal": text}]}
    if kind == "custom_tool_call":
        return {**item, "input": text}
    return {**item, "arguments": text} if "arguments" in item else item


def text_part(text: str, logprobs: orjson.Fragment | list[Any]) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


class Events:
    """The events of one Response, under sequence numbers that rise by one across all its
    rounds; none are made for a whole (non-streaming) answer."""

    __slots__ = ("_streaming", "sequence", "_made", "_taken")

    def __init__(self, streaming: bool) -> None:
        self._streaming = streaming
        self.sequence = 0  # the next event's
        self._made: list[bytes] = []
        self._taken: list[bytes] = []  # the events of the last batch

    def emit(self, event: str, **fields: Any) -> None:
        if not self._streaming:
            return
        fields["type"] = event
        fields["sequence_number"] = self.sequence
        self.sequence += 1
        self._made.append(encoded_event(fields) + b"\n\n")

    def whole(self, index: int, item: dict[str, Any]) -> None:
        """An item the proxy made whole, at output `index`: added, its progress, done."""
        self.emit("response.output_item.added", output_index=index, item=opening(item))
        for event, fields in progress(item):
            self.emit(event, item_id=item["id"], output_index=index, **fields)
        self.emit("response.output_item.done", output_index=index, item=item)

    def close_reasoning(self, item: OpenItem, text: str, summary: bool, seal: Callable[[str], str] | None) -> None:
        """A reasoning item's text done; its summary too, where the call asks for one (8.5), and
        sealed, where it asks for that (8.6)."""
        part = {"type": "reasoning_text", "text": text}
        self.emit("response.reasoning_text.done", **item.at, content_index=0, text=text)
        self.part("response.content_part.done", item, part)
        item.item["content"] = [part]
        if summary:
            # The model has no summariser: its reasoning is its summary (design.md 8.5).
            self.emit("response.reasoning_summary_text.done", **item.at, summary_index=0, text=text)
            item.item["summary"] = [self.summary_part("response.reasoning_summary_part.done", item, text)]
        if seal is not None:
            item.item["encrypted_content"] = seal(text)

    def summary_part(self, event: str, item: OpenItem, text: str) -> dict[str, Any]:
        part = {"type": "summary_text", "text": text}
        self.emit(event, **item.at, summary_index=0, part=part)
        return part

    def part(self, event: str, item: OpenItem, part: dict[str, Any]) -> None:
        self.emit(event, **item.at, content_index=0, part=part)

    def delta(self, item: OpenItem, event: str, index: str | None, delta: bytes, tail: bytes = b"") -> None:
        """A delta event (most of a stream) from its head, encoded once per item and event type,
        and its `delta`, already JSON (design.md 7.3)."""
        if not self._streaming:
            return
        head = item.heads.get(event)
        if head is None:
            fields = {"type": event, **item.at}
            if index is not None:
                fields[index] = 0
            head = item.heads[event] = b'event: %s\ndata: %s,"delta":' % (event.encode(), orjson.dumps(fields)[:-1])
        self._made.append(b'%s%s%s,"sequence_number":%d}\n\n' % (head, delta, tail, self.sequence))
        self.sequence += 1

    def take(self, ended: bool) -> bytes:
        """The events made since the last batch as SSE, and `[DONE]` after the terminal one."""
        events = self._taken = self._made
        self._made = []
        data = b"".join(events)
        return data + DONE if events and ended and self._streaming else data

    def flushed(self) -> list[tuple[int, bytes]]:
        """The events of the last batch, each under its sequence number and without the blank
        line that ends it: what an event log keeps (design.md 10.2)."""
        events = self._taken
        first = self.sequence - len(events)
        return [(first + i, event[:-2]) for i, event in enumerate(events)]
