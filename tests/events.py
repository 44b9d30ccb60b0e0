"""Shared by the streaming tests: upstream SSE built from a scripted `Generation`, the
translator driven over it, and the streaming event contract (design.md 3.7-3.9, 4) checked on
what comes out. The expectations here are computed from the chat chunks alone, never from
the proxy's code."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from proxy.responses.mcp import Servers
from proxy.responses.plan import Call, TranslationSettings, plan_call
from proxy.responses.schema import parse_request
from proxy.responses.sealing import Sealer
from proxy.responses.sse import DEFAULT_MAX_EVENT
from proxy.responses.translate import IdSource, ResponseTranslator
from tests.client import LOGPROBS, parse_sse, validate_event, validate_response

TERMINAL = ("response.completed", "response.incomplete", "response.failed")
# Delta event type -> the event type that closes it and the key holding the full text.
DELTAS = {
    "response.output_text.delta": ("response.output_text.done", "text"),
    "response.reasoning_text.delta": ("response.reasoning_text.done", "text"),
    "response.reasoning_summary_text.delta": ("response.reasoning_summary_text.done", "text"),
    "response.function_call_arguments.delta": ("response.function_call_arguments.done", "arguments"),
    "response.custom_tool_call_input.delta": ("response.custom_tool_call_input.done", "input"),
    "response.refusal.delta": ("response.refusal.done", "refusal"),
}
# Deltas that need no content part first.
_PARTLESS = {"response.function_call_arguments.delta", "response.custom_tool_call_input.delta", "response.reasoning_summary_text.delta"}


def frame(chunk: dict, nl: str = "\n") -> bytes:
    return b"data: " + orjson.dumps(chunk) + (nl * 2).encode()


def framed(chunks: Iterable[dict], nl: str = "\n") -> list[bytes]:
    """Chat chunks as the frames an upstream writes, one each."""
    return [frame(c, nl) for c in chunks]


def split(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    """`data` cut at each offset in `cuts` (any order, repeats give empty pieces)."""
    bounds = [0, *sorted(cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


def sse(chunks: Iterable[dict], *, done: bool = True, nl: str = "\n") -> bytes:
    """Chat chunks as an upstream writes them, `data: [DONE]` last when `done`."""
    return b"".join(framed(chunks, nl)) + (b"data: [DONE]" + (nl * 2).encode() if done else b"")


def error_frame(message: str = "boom", code: int | str = 500) -> bytes:
    """SGLang's mid-stream error frame."""
    return frame({"error": {"object": "error", "message": message, "type": "InternalServerError", "param": None, "code": code}})


def plan(logprobs: bool = True, *, sealer: Sealer | None = None, servers: Servers | None = None, **body: Any) -> Call:
    """`servers`: what the request's MCP servers listed, as the turn layer found it (design.md 14)."""
    request = {"model": "m", "input": "hi", "stream": True, **body}
    if logprobs:
        request["include"] = [*LOGPROBS, *body.get("include", [])]
    return plan_call(parse_request(request), TranslationSettings(model="m", sealer=sealer), servers=servers)


NOW = 1_750_000_000
REQUEST_ID = "req-test"


def numbered_ids() -> IdSource:
    """An id source for the translator that numbers ids in the order they are minted, so that
    two runs of the same script give the same events, byte for byte."""
    count = itertools.count()
    return lambda prefix: f"{prefix}_{next(count)}"


def fixed(**options: Any) -> dict[str, Any]:
    """A translator's clock and id source, fixed (see `numbered_ids`)."""
    return {"clock": lambda: NOW, "ids": numbered_ids(), **options}


def translate(call: Call, pieces: Iterable[bytes], *, finish: bool = True, max_event: int = DEFAULT_MAX_EVENT) -> tuple[ResponseTranslator, list[dict]]:
    """Drive a fresh translator (fixed clock and ids) over `pieces` (then end of input); the
    events it wrote."""
    translator = ResponseTranslator(call, **fixed(), request_id=REQUEST_ID, max_event=max_event)
    out = [translator.start()]
    out += [translator.feed(piece) for piece in pieces]
    if finish:
        out.append(translator.finish())
    raw = b"".join(out)
    return translator, parse_sse(raw) if translator.done else parse_sse(raw + b"data: [DONE]\n\n")


def completed(call: Call, body: bytes) -> dict[str, Any]:
    """A whole non-streaming chat completion through a fresh translator (fixed clock and ids):
    the Response, as a client reads its JSON."""
    return dict(orjson.loads(orjson.dumps(ResponseTranslator(call, streaming=False, **fixed()).complete(body))))


# -- what the upstream sent -----------------------------------------------------------------


def chunk_scores(chunk: dict) -> list[dict]:
    choices = chunk.get("choices") or [{}]
    return (choices[0].get("logprobs") or {}).get("content") or []


def as_response_logprob(entry: dict) -> dict:
    """design.md 3.5, written out independently of the proxy: exactly four keys, bytes default
    to the token's UTF-8, a null (or absent) logprob or llama.cpp's lowest float is -9999.0."""

    def one(e: dict) -> dict:
        logprob = e.get("logprob")
        token_bytes = e.get("bytes")
        return {
            "token": e["token"],
            "logprob": -9999.0 if logprob is None or logprob < -1e37 else logprob,
            "bytes": list(e["token"].encode()) if token_bytes is None else token_bytes,
        }

    return {**one(entry), "top_logprobs": [one(t) for t in entry.get("top_logprobs") or []]}


def sent_scores(chunks: Iterable[dict]) -> list[dict]:
    """Every score in the chunks, in order, as the Responses entries they must become."""
    return [as_response_logprob(s) for c in chunks for s in chunk_scores(c)]


def expected_deltas(chunks: Iterable[dict]) -> list[tuple[str, list[dict]]]:
    """design.md 3.7's pending-score buffer as a model: each chunk with output text gets a delta
    carrying every pending score plus its own."""
    deltas, pending = [], []
    for chunk in chunks:
        pending += [as_response_logprob(s) for s in chunk_scores(chunk)]
        text = ((chunk.get("choices") or [{}])[0].get("delta") or {}).get("content")
        if text:
            deltas.append((text, pending))
            pending = []
    return deltas


def tokens(scores: list[dict]) -> list[str]:
    return [s["token"] for s in scores]


# -- what the translator sent ---------------------------------------------------------------


@dataclass
class _Item:
    id: str
    type: str
    part_added: bool = False
    summary_part_added: bool = False
    deltas: list[dict] = field(default_factory=list)
    done_events: dict[str, dict] = field(default_factory=dict)
    item: dict | None = None  # from output_item.done


@dataclass
class Stream:
    events: list[dict]
    response: dict
    items: list[_Item]

    @property
    def terminal(self) -> str:
        return self.events[-1]["type"]

    @property
    def message(self) -> _Item | None:
        messages = [item for item in self.items if item.type == "message" and item.item["content"][0]["type"] == "output_text"]
        assert len(messages) <= 1, "one message item at most (a refusal is another)"
        return messages[0] if messages else None

    @property
    def deltas(self) -> list[tuple[str, list[dict]]]:
        """The message's output_text deltas as (text, logprobs)."""
        return [(d["delta"], d["logprobs"]) for d in self.message.deltas] if self.message else []

    @property
    def logprobs(self) -> list[dict]:
        """The message's full list (from the final response), [] without a message."""
        return self.message.item["content"][0]["logprobs"] if self.message else []

    @property
    def text(self) -> str | None:
        return self.message.item["content"][0]["text"] if self.message else None

    def of_type(self, kind: str) -> list[dict]:
        return [item.item for item in self.items if item.type == kind]


def check_stream(events: list[dict]) -> Stream:
    """Assert the streaming event contract on one response's events; returns them digested."""
    types = [e["type"] for e in events]
    for number, event in enumerate(events):
        validate_event(event)
        assert event["sequence_number"] == number, types
    assert types[:2] == ["response.created", "response.in_progress"], types
    assert events[0]["response"]["usage"] is None and events[1]["response"]["usage"] is None, "null until it ends (design.md 5.1)"
    assert sum(t in TERMINAL for t in types) == 1 and types[-1] in TERMINAL, types
    response = events[-1]["response"]
    validate_response(response)
    assert {e["response"]["id"] for e in events if "response" in e} == {response["id"]}
    assert response["status"] == types[-1].removeprefix("response.")
    if types[-1] == "response.failed":
        error = events[-2]
        assert set(error) == {"type", "code", "message", "param", "sequence_number"}, error
        assert error["type"] == "error" and isinstance(error["code"], str) and error["message"]
        assert set(response["error"]) == {"code", "message"} and isinstance(response["error"]["code"], str)
        assert response["error"]["message"] == error["message"]
    else:
        assert "error" not in types and response["error"] is None
    if types[-1] == "response.completed":
        assert isinstance(response["completed_at"], int)
    else:
        assert response["completed_at"] is None

    items: list[_Item] = []
    open_other: _Item | None = None  # the open reasoning, tool call or refusal item
    for event in events:
        kind = event["type"]
        if kind == "response.output_item.added":
            assert event["output_index"] == len(items), "output_index dense, in order of output_item.added"
            assert event["item"].get("status", "in_progress") == "in_progress"  # MCP listings and approval requests have none
            item = _Item(event["item"]["id"], event["item"]["type"])
            if item.type != "message":
                assert open_other is None, "items follow one another"
                open_other = item
            items.append(item)
            continue
        if "output_index" not in event:
            continue
        item = items[event["output_index"]]
        assert item.item is None, f"{kind} after its item was done"
        if "item_id" in event:
            assert event["item_id"] == item.id
        if kind == "response.output_item.done":
            assert event["item"]["id"] == item.id and event["item"]["type"] == item.type
            item.item = event["item"]
            if item is open_other:
                open_other = None
        elif kind == "response.content_part.added":
            item.part_added = True
            if event["part"]["type"] == "refusal":  # a message of its own (design.md 4.5)
                assert open_other is None, "items follow one another"
                open_other = item
        elif kind == "response.reasoning_summary_part.added":
            item.summary_part_added = True
        elif kind in DELTAS:
            assert event["delta"], f"empty {kind}"
            if kind not in _PARTLESS:
                assert item.part_added, f"{kind} before content_part.added"
            if kind == "response.reasoning_summary_text.delta":
                assert item.summary_part_added, f"{kind} before reasoning_summary_part.added"
            if kind == "response.output_text.delta":
                assert open_other is None, "text while another item is open"
            item.deltas.append(event)
        else:
            item.done_events[kind] = event

    assert all(item.item is not None for item in items), "every item is done"
    assert [item.id for item in items] == [o["id"] for o in response["output"]]
    assert [item.item for item in items] == response["output"]
    done_order = [e["item"]["id"] for e in events if e["type"] == "response.output_item.done"]
    for item in items:
        for delta_type in {d["type"] for d in item.deltas}:
            closing, key = DELTAS[delta_type]
            assert item.done_events[closing][key] == "".join(d["delta"] for d in item.deltas if d["type"] == delta_type)
        if item.type == "message":
            part = item.done_events["response.content_part.done"]["part"]
            assert item.item["content"] == [part]
            if part["type"] == "refusal":
                continue
            assert done_order[-1] == item.id, "the message closes last"
            text_done = item.done_events["response.output_text.done"]
            assert (text_done["text"], text_done["logprobs"]) == (part["text"], part["logprobs"])
            streamed = [s for d in item.deltas for s in d["logprobs"]]
            assert part["logprobs"][: len(streamed)] == streamed, "delta scores are a prefix of the full list"
    return Stream(events, response, items)


def without_ids(value: Any, names: dict[str, str] | None = None) -> Any:
    """`value` with minted ids numbered by first appearance (so two runs compare equal, and an
    id that changes inside one run still shows) and timestamps zeroed."""
    names = {} if names is None else names
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if key in ("id", "item_id") and isinstance(item, str):
                item = names.setdefault(item, f"{item.split('_')[0]}#{len(names)}")
            elif key in ("created_at", "completed_at") and item is not None:
                item = 0
            out[key] = without_ids(item, names)
        return out
    if isinstance(value, list):
        return [without_ids(item, names) for item in value]
    return value
