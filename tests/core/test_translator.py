"""ResponseTranslator without a socket: chat chunks in, Responses events out (design.md 3.7-3.9, 4)."""

from __future__ import annotations

import orjson
import pytest

from proxy.errors import UpstreamTimeout
from proxy.responses.chat import upstream_error
from proxy.responses.lifecycle import response_id
from proxy.responses.plan import TranslationSettings, plan_call
from proxy.responses.schema import parse_request
from proxy.responses.sse import DEFAULT_MAX_EVENT
from proxy.responses.translate import ResponseTranslator
from tests.client import parse_sse
from tests.events import (
    NOW,
    REQUEST_ID,
    as_response_logprob,
    check_stream,
    completed,
    error_frame,
    expected_deltas,
    frame,
    plan,
    sent_scores,
    sse,
    tokens,
    translate,
)
from tests.fake_upstream import Generation, Step, score


def s(*names: str) -> list[dict]:
    return [score(name) for name in names]


def run(gen: Generation, *, logprobs: bool = True):
    chunks = gen.chunks()
    return chunks, check_stream(translate(plan(logprobs), [sse(chunks)])[1])


def delta_tokens(stream) -> list[list[str]]:
    return [tokens(scores) for _, scores in stream.deltas]


# -- the pending-score buffer (3.7) ---------------------------------------------------------

SEED = [
    Step("reasoning", "A", s("A")),
    Step("text", "B", s("B")),
    Step("text", "C", s("C")),
    Step("finish", scores=s("D"), finish_reason="stop"),
]


def test_seed_case_event_for_event() -> None:
    """design.md 3.7's example as the whole stream, spelled out: with a fixed clock and ids
    (as h11's tests do) the events compare as they are."""
    a, b, c, d = (as_response_logprob(score(token)) for token in "ABCD")
    _, events = translate(plan(), [sse(Generation(SEED, prompt_tokens=3).chunks())])
    on_reasoning = {"item_id": "rs_1", "output_index": 0, "content_index": 0}
    on_message = {"item_id": "msg_2", "output_index": 1, "content_index": 0}
    reasoning = {"id": "rs_1", "type": "reasoning", "summary": []}
    message = {"id": "msg_2", "type": "message", "role": "assistant"}
    reasoning_done = {**reasoning, "status": "completed", "content": [{"type": "reasoning_text", "text": "A"}]}
    text_done = {"type": "output_text", "text": "BC", "annotations": [], "logprobs": [a, b, c, d]}
    message_done = {**message, "status": "completed", "content": [text_done]}
    expected = [
        {"type": "response.output_item.added", "output_index": 0, "item": {**reasoning, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **on_reasoning, "part": {"type": "reasoning_text", "text": ""}},
        {"type": "response.reasoning_text.delta", **on_reasoning, "delta": "A"},
        {"type": "response.reasoning_text.done", **on_reasoning, "text": "A"},
        {"type": "response.content_part.done", **on_reasoning, "part": {"type": "reasoning_text", "text": "A"}},
        {"type": "response.output_item.done", "output_index": 0, "item": reasoning_done},
        {"type": "response.output_item.added", "output_index": 1, "item": {**message, "status": "in_progress", "content": []}},
        {"type": "response.content_part.added", **on_message, "part": {**text_done, "text": "", "logprobs": []}},
        {"type": "response.output_text.delta", **on_message, "delta": "B", "logprobs": [a, b]},
        {"type": "response.output_text.delta", **on_message, "delta": "C", "logprobs": [c]},
        {"type": "response.output_text.done", **on_message, "text": "BC", "logprobs": [a, b, c, d]},
        {"type": "response.content_part.done", **on_message, "part": text_done},
        {"type": "response.output_item.done", "output_index": 1, "item": message_done},
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(expected) + 3))
    items = [{k: v for k, v in e.items() if k != "sequence_number"} for e in events[2:-1]]
    assert items == expected
    created, in_progress, completed = events[0]["response"], events[1]["response"], events[-1]["response"]
    assert created == in_progress
    assert (created["id"], created["status"], created["created_at"], created["output"]) == ("resp_0", "in_progress", NOW, [])
    assert completed == {
        **created,
        "status": "completed",
        "completed_at": NOW,
        "output": [reasoning_done, message_done],
        "usage": {
            "input_tokens": 3,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": 4,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 7,
        },
    }


@pytest.mark.parametrize(
    ("dialect", "steps", "deltas"),
    [
        # design.md 3.7's example: reasoning A, text B, text C, finish, late score D.
        ("sglang", SEED, [["A", "B"], ["C"]]),
        # vLLM ends on the last text chunk, which carries C and D with finish_reason.
        ("vllm", SEED, [["A", "B"], ["C", "D"]]),
        # SGLang with a tool parser: text chunks carry no scores, a logprobs-only chunk follows.
        (
            "sglang",
            [Step("text", "B"), Step("scores", scores=s("B")), Step("text", "C"), Step("scores", scores=s("C")),
             Step("finish", finish_reason="stop")],
            [[], ["B"]],
        ),
        # Parser hold-back: the scores come before the text they belong to.
        ("sglang", [Step("scores", scores=s("B", "C")), Step("text", "BC"), Step("finish", finish_reason="stop")], [["B", "C"]]),
        # A reasoning chunk carries the score of an answer token decoded in the same step.
        (
            "sglang",
            [Step("reasoning", "A", s("A", "B")), Step("text", "B"), Step("text", "C", s("C")), Step("finish", finish_reason="stop")],
            [["A", "B"], ["C"]],
        ),
        # A chunk with empty text sends no delta; its score waits for the next one.
        ("sglang", [Step("text", "", s("x")), Step("text", "B", s("B")), Step("finish", finish_reason="stop")], [["x", "B"]]),
        # Scores of a tool call between two texts ride on the second text.
        (
            "vllm",
            [Step("text", "B", s("B")), Step("tool", "{}", s("t1", "t2"), tool_id="c1", tool_name="f"), Step("text", "C", s("C")),
             Step("finish", finish_reason="stop")],
            [["B"], ["t1", "t2", "C"]],
        ),
    ],
    ids=["seed", "vllm-finish-on-text", "tool-parser", "scores-first", "reasoning-carries-answer", "empty-text", "tool-between"],
)
def test_pending_scores(dialect: str, steps: list[Step], deltas: list[list[str]]) -> None:
    chunks, stream = run(Generation(steps, dialect=dialect))
    assert stream.terminal == "response.completed"
    assert delta_tokens(stream) == deltas
    assert stream.deltas == expected_deltas(chunks)
    everything = sent_scores(chunks)
    assert tokens(everything) == [t for step in steps for t in tokens(step.scores)]
    assert stream.logprobs == everything  # check_stream: the same list on every done event
    assert stream.text == "".join(step.text for step in steps if step.kind == "text")


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
def test_streamed_equals_non_streaming(dialect: str) -> None:
    gen = Generation(
        [Step("reasoning", "hm", s("h", "m")), Step("text", "Hi", s("Hi")), Step("tool", '{"a":', s("{"), tool_id="c1", tool_name="f"),
         Step("tool", "1}", s("1}")), Step("finish", finish_reason="tool_calls", scores=s("<eos>"))],
        dialect=dialect,
    )
    _, stream = run(gen)
    call = plan()
    whole = completed(call, orjson.dumps(gen.completion()))
    assert stream.response == whole


@pytest.mark.parametrize(
    "steps",
    [
        [Step("tool", '{"a":1}', s("{", "a"), tool_id="c1", tool_name="f"), Step("finish", finish_reason="tool_calls", scores=s("<eos>"))],
        [Step("reasoning", "hm", s("h", "m")), Step("finish", finish_reason="stop", scores=s("<eos>"))],
    ],
    ids=["tool-only", "reasoning-only"],
)
@pytest.mark.parametrize("logprobs", [True, False])
def test_scores_without_text_get_an_empty_message(steps: list[Step], logprobs: bool) -> None:
    """design.md 3.9: with logprobs asked for, an answer with scores but no text gets an empty
    message, last, carrying them; without, no message is made up."""
    chunks, stream = run(Generation(steps), logprobs=logprobs)
    types = [item["type"] for item in stream.response["output"]]
    assert types == [steps[0].kind.replace("tool", "function_call")] + (["message"] if logprobs else [])
    if logprobs:
        assert stream.text == "" and stream.deltas == []
        assert stream.logprobs == sent_scores(chunks)
        assert stream.message.item["status"] == "completed"


def all_logprobs(value) -> list:
    if isinstance(value, dict):
        return [v for k, v in value.items() if k == "logprobs"] + [x for v in value.values() for x in all_logprobs(v)]
    if isinstance(value, list):
        return [x for v in value for x in all_logprobs(v)]
    return []


def test_without_include_every_logprobs_is_empty() -> None:
    # The upstream sends scores anyway (it was not asked to): none may show.
    _, stream = run(Generation(SEED), logprobs=False)
    found = all_logprobs(stream.events)
    assert len(found) >= 6 and all(lp == [] for lp in found)
    assert stream.text == "BC"


# -- the event contract (4) -----------------------------------------------------------------


def position(stream, kind: str, item_type: str) -> int:
    return next(
        i for i, e in enumerate(stream.events) if e["type"] == kind and e.get("item", {}).get("type") == item_type
    )


@pytest.mark.parametrize("then", ["text", "tool"])
def test_reasoning_closes_when_the_next_item_begins(then: str) -> None:
    steps = [Step("reasoning", "hm"), Step(then, "x", tool_id="c1", tool_name="f"), Step("finish", finish_reason="stop")]
    _, stream = run(Generation(steps))
    other = "message" if then == "text" else "function_call"
    assert position(stream, "response.output_item.done", "reasoning") < position(stream, "response.output_item.added", other)
    assert [item["status"] for item in stream.response["output"]] == ["completed", "completed"]


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
@pytest.mark.parametrize(
    "head",
    [
        [Step("tool", '{"a"'), Step("tool", ":", tool_id="c1", tool_name="f")],
        [Step("tool", '{"a":', tool_name="f"), Step("tool", "", tool_id="c1")],
        [Step("tool", '{"a"', tool_id="c1"), Step("tool", ":", tool_name="f")],
    ],
    ids=["id-and-name-late", "name-then-id", "id-then-name"],
)
def test_function_call_opens_once_id_and_name_are_known(dialect: str, head: list[Step]) -> None:
    steps = [*head, Step("tool", "1}"), Step("finish", finish_reason="tool_calls")]
    _, stream = run(Generation(steps, dialect=dialect))
    events = stream.events
    added = position(stream, "response.output_item.added", "function_call")
    assert events[added]["item"]["call_id"] == "c1" and events[added]["item"]["name"] == "f"
    # The fragments held until then come right after, in one delta.
    held = "".join(step.text for step in head)
    assert events[added + 1]["type"] == "response.function_call_arguments.delta"
    assert events[added + 1]["delta"] == held
    (call,) = stream.of_type("function_call")
    assert (call["call_id"], call["name"], call["arguments"], call["status"]) == ("c1", "f", '{"a":1}', "completed")


def calls_at_index_zero(*steps: Step, index: bool = True) -> bytes:
    """A vLLM-style stream whose tool calls all come at index 0, or with no index."""
    chunks = Generation([*steps, Step("finish", finish_reason="tool_calls")], dialect="vllm").chunks()
    if not index:
        for chunk in chunks:
            for call in (chunk["choices"] and chunk["choices"][0]["delta"].get("tool_calls")) or ():
                del call["index"]
    return sse(chunks)


@pytest.mark.parametrize("index", [True, False], ids=["index-0-repeated", "index-missing"])
def test_another_id_at_the_same_index_is_another_call(index: bool) -> None:
    """design.md 6.4: Ollama gives every call index 0, Gemini's compatibility endpoint none."""
    body = calls_at_index_zero(
        Step("tool", '{"x":1}', tool_id="c1", tool_name="f"), Step("tool", '{"y":', tool_id="c2", tool_name="g"), Step("tool", "2}"), index=index
    )
    stream = check_stream(translate(plan(), [body])[1])
    assert stream.terminal == "response.completed"
    assert [(c["call_id"], c["name"], c["arguments"]) for c in stream.of_type("function_call")] == [("c1", "f", '{"x":1}'), ("c2", "g", '{"y":2}')]


def test_fragments_that_each_bring_a_fresh_id_stay_one_call() -> None:
    """design.md 6.4: Poolside gives every fragment of a call its own id, the name on the first."""
    body = calls_at_index_zero(Step("tool", "", tool_id="c1", tool_name="f"), Step("tool", '{"x":', tool_id="c2"), Step("tool", "1}", tool_id="c3"))
    stream = check_stream(translate(plan(), [body])[1])
    assert stream.terminal == "response.completed"
    assert [(c["call_id"], c["name"], c["arguments"]) for c in stream.of_type("function_call")] == [("c1", "f", '{"x":1}')]


def test_a_call_left_without_a_name_by_the_next_id_fails() -> None:
    body = calls_at_index_zero(Step("tool", '{"x":1}', tool_id="c1"), Step("tool", "{}", tool_id="c2", tool_name="g"))
    stream = check_stream(translate(plan(), [body])[1])
    assert stream.terminal == "response.failed" and stream.of_type("function_call") == []


@pytest.mark.parametrize("finish", [("length", "max_output_tokens"), ("content_filter", "content_filter")], ids=lambda f: f[0])
@pytest.mark.parametrize(
    ("steps", "cut"),
    [
        ([Step("reasoning", "hm"), Step("text", "Hi")], "message"),
        ([Step("reasoning", "hm"), Step("text", "Hi"), Step("tool", '{"a', tool_id="c1", tool_name="f")], "function_call"),
        ([Step("reasoning", "hm")], "reasoning"),
        # A call whose id never came becomes an item only at the end: still the one cut.
        ([Step("text", "Hi"), Step("tool", '{"a', tool_name="f")], "function_call"),
    ],
    ids=["cut-in-text", "cut-in-tool-call", "cut-in-reasoning", "cut-in-call-without-id"],
)
def test_cut_short_is_incomplete(steps: list[Step], cut: str, finish: tuple[str, str]) -> None:
    """design.md 4.8: the item being generated when the cut came is `incomplete`, every other
    item `completed`."""
    reason, detail = finish
    _, stream = run(Generation([*steps, Step("finish", finish_reason=reason)]))
    assert stream.terminal == "response.incomplete"
    assert stream.response["incomplete_details"] == {"reason": detail}
    statuses = {item["type"]: item["status"] for item in stream.response["output"]}
    assert statuses == {kind: "incomplete" if kind == cut else "completed" for kind in statuses}


# -- faults ---------------------------------------------------------------------------------

FAULTY = Generation(
    [Step("reasoning", "A", s("A")), Step("text", "B", s("B")), Step("tool", '{"a":', s("{"), tool_id="c1", tool_name="f"),
     Step("tool", "1}", s("1}")), Step("finish", finish_reason="tool_calls", scores=s("<eos>"))]
)
CHUNKS = FAULTY.chunks()  # role, 5 steps, usage


def assert_failed_after(k: int, pieces: list[bytes], message: str | None = None, max_event: int = DEFAULT_MAX_EVENT) -> None:
    """The translator failed after reading CHUNKS[:k]: what was open then is closed
    `incomplete`, what was closed stays `completed`, every score read so far is on the message."""
    _, events = translate(plan(), pieces, max_event=max_event)
    stream = check_stream(events)
    assert stream.terminal == "response.failed"
    if message is not None:
        assert stream.events[-2]["message"] == message
    _, before = translate(plan(), [sse(CHUNKS[:k], done=False)], finish=False)
    added = [e["item"]["id"] for e in before if e["type"] == "response.output_item.added"]
    closed = {e["item"]["id"] for e in before if e["type"] == "response.output_item.done"}
    statuses = [item["status"] for item in stream.response["output"]]
    assert statuses[: len(added)] == ["completed" if i in closed else "incomplete" for i in added]
    assert all(status == "incomplete" for status in statuses[len(added) :])
    assert stream.logprobs == sent_scores(CHUNKS[:k])
    assert (stream.message is not None) == bool(sent_scores(CHUNKS[:k]))


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"detail": "Not Found"}', "Not Found"),
        (b'{"detail": [{"loc": ["body", "messages", 0], "msg": "Field required", "type": "missing"}, {"loc": ["body", "n"], "msg": "too big"}]}',
         "body.messages.0: Field required; body.n: too big"),
    ],
    ids=["text", "validation-list"],
)
def test_fastapi_error_details_read_as_words(body: bytes, message: str) -> None:
    error = upstream_error(body, 422)
    assert (error.status, error.message) == (422, message)


@pytest.mark.parametrize("k", range(1, len(CHUNKS) + 1))
@pytest.mark.parametrize(
    ("code", "shown"),
    [(400, "it broke"), (500, f"upstream error (server_error); request id {REQUEST_ID}")],
    ids=["client-fault", "upstream-fault"],
)
def test_error_frame_mid_stream(k: int, code: int, shown: str) -> None:
    """An upstream's words reach the client only when the fault was the request's
    (design.md 5.7); SGLang sends finish and usage chunks (and [DONE]) after its error frame:
    none may count."""
    body = sse(CHUNKS[:k], done=False) + error_frame("it broke", code) + sse(CHUNKS[k:])
    assert_failed_after(k, [body], shown)


@pytest.mark.parametrize("garbage", [b"data: garbage\n\n", b'data: {"choices": 5}\n\n', b"data: {\n\n"])
@pytest.mark.parametrize("k", [2, 4])
def test_unreadable_chunk_fails(garbage: bytes, k: int) -> None:
    assert_failed_after(k, [sse(CHUNKS[:k], done=False) + garbage + sse(CHUNKS[k:])])


def with_a_big_event(k: int) -> tuple[list[bytes], ...]:
    """CHUNKS with an event over 4096 bytes after the first k, in one read, two, and a byte a read."""
    before = sse(CHUNKS[:k], done=False)
    big = {"object": "chat.completion.chunk", "choices": [], "padding": "x" * 5000}  # ignored, when read
    body = before + frame(big) + sse(CHUNKS[k:])
    return [body], [body[: len(before) + 100], body[len(before) + 100 :]], [body[i : i + 1] for i in range(len(body))]


@pytest.mark.parametrize("k", range(1, len(CHUNKS) - 1))
def test_an_event_over_the_limit_fails_the_stream_after_the_events_before_it(k: int) -> None:
    """design.md 6.11: whichever read it comes in, the chunks before it are read and their
    scores kept, and nothing after it."""
    for pieces in with_a_big_event(k):
        assert_failed_after(k, pieces, max_event=4096)


def test_an_event_over_the_limit_after_the_finish_is_usage_lost() -> None:
    """design.md 4.9: the generation finished; the response completes at once, every score on it."""
    for pieces in with_a_big_event(len(CHUNKS) - 1):
        translator, events = translate(plan(), pieces, max_event=4096, finish=False)
        stream = check_stream(events)
        assert translator.done and stream.terminal == "response.completed" and stream.logprobs == sent_scores(CHUNKS)


@pytest.mark.parametrize("k", range(1, len(CHUNKS) - 1))
def test_stream_cut_before_finish_fails(k: int) -> None:
    assert_failed_after(k, [sse(CHUNKS[:k], done=False)])


def test_stream_cut_inside_a_frame_fails() -> None:
    body = sse(CHUNKS[:3], done=False) + frame(CHUNKS[3])[:25]
    assert_failed_after(3, [body])


def test_upstream_abort_fails() -> None:
    gen = Generation([Step("text", "B", s("B")), Step("finish", finish_reason="abort", scores=s("x"))])
    chunks, stream = run(gen)
    assert stream.terminal == "response.failed"
    assert stream.message.item["status"] == "incomplete"
    assert stream.logprobs == sent_scores(chunks)


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("limit", [{"max_output_tokens": 3}, {"defaults": {"max_tokens": 3}}], ids=["asked", "route"])
@pytest.mark.parametrize(
    ("arguments", "used", "status"),
    [('{"city": "Pa', 3, "incomplete"), ('{"city": "Pa', 2, "completed"), ('{"city": "Paris"}', 3, "completed")],
    ids=["cut", "under-the-limit", "whole-on-the-last-token"],
)
def test_a_tool_call_cut_by_the_token_limit_is_incomplete_though_vllm_says_tool_calls(stream: bool, limit: dict, arguments: str, used: int, status: str) -> None:
    """design.md 4.8: vLLM reports a tool call cut by the limit (the request's, or the route's
    default) as finished `tool_calls`; arguments that are whole JSON finished on its last token."""
    steps = [Step("tool", arguments, s("x"), tool_id="call_0", tool_name="weather"), Step("finish", finish_reason="tool_calls")]
    gen = Generation(steps, completion_tokens=used, dialect="vllm")
    body = {"input": "hi", "stream": stream, "max_output_tokens": limit.get("max_output_tokens")}
    call = plan_call(parse_request({"model": "m", **body}), TranslationSettings(model="m", defaults=limit.get("defaults")))
    if stream:
        response = check_stream(translate(call, [sse(gen.chunks())])[1]).response
    else:
        response = orjson.loads(orjson.dumps(ResponseTranslator(call, streaming=False).complete(orjson.dumps(gen.completion()))))
    assert response["status"] == status and response["output"][0]["status"] == status
    assert response["incomplete_details"] == ({"reason": "max_output_tokens"} if status == "incomplete" else None)


def test_a_refusal_beside_text_is_a_message_of_its_own() -> None:
    """design.md 4.5: text, then a refusal: two messages, the scores on the text's, the contract
    checked on every event."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"content": "Sure"}, "logprobs": {"content": s("Sure")}}]},
        *({**head, "choices": [{"index": 0, "delta": {"refusal": word}, "logprobs": {"content": s(word)}}]} for word in ("I ", "can't")),
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    stream = check_stream(translate(plan(), [sse(chunks)])[1])
    assert [item["content"][0]["type"] for item in stream.response["output"]] == ["output_text", "refusal"]
    assert stream.response["output"][1]["content"][0]["refusal"] == "I can't"
    assert stream.logprobs == sent_scores(chunks)


@pytest.mark.parametrize(
    ("after", "finish"),
    [({"content": "Sure"}, "stop"), ({"tool_calls": [{"index": 0, "id": "call_0", "function": {"name": "weather", "arguments": "{}"}}]}, "tool_calls")],
    ids=["then-text", "then-a-tool-call"],
)
def test_a_refusal_closes_when_text_or_a_tool_call_begins(after: dict, finish: str) -> None:
    """design.md 4.5: as a reasoning item does: its `output_item.done` before the next item's
    `output_item.added`; every score still on the text's message."""
    head = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    chunks = [
        *({**head, "choices": [{"index": 0, "delta": {"refusal": word}, "logprobs": {"content": s(word)}}]} for word in ("I ", "can't")),
        {**head, "choices": [{"index": 0, "delta": after, "logprobs": {"content": s("next")}}]},
        {**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
    ]
    stream = check_stream(translate(plan(), [sse(chunks)])[1])
    edges = [(e["type"], e["output_index"]) for e in stream.events if e["type"] in ("response.output_item.added", "response.output_item.done")]
    assert edges.index(("response.output_item.done", 0)) < edges.index(("response.output_item.added", 1))
    assert stream.response["output"][0]["content"] == [{"type": "refusal", "refusal": "I can't"}]
    assert stream.logprobs == sent_scores(chunks)


@pytest.mark.parametrize("usage", [True, False])
def test_stream_without_done_but_finished_completes(usage: bool) -> None:
    chunks = FAULTY.chunks(usage=usage)
    with_done = check_stream(translate(plan(), [sse(chunks)])[1])
    without = check_stream(translate(plan(), [sse(chunks, done=False)])[1])
    assert without.terminal == with_done.terminal == "response.completed"
    assert without.events == with_done.events
    assert (without.response["usage"]["total_tokens"] > 0) == usage  # design.md 5.1: zeros, not null, when none came


@pytest.mark.parametrize("k", [1, 3, 5])
def test_fail_mid_stream(k: int) -> None:
    translator, events = translate(plan(), [sse(CHUNKS[:k], done=False)], finish=False)
    error = UpstreamTimeout("upstream sent nothing for 1 s")
    tail = translator.fail(error)
    stream = check_stream([*events, *parse_sse(tail)])
    assert stream.terminal == "response.failed" and translator.done
    assert stream.events[-2]["code"] == error.code and stream.events[-2]["message"] == error.for_client(REQUEST_ID).message
    assert translator.error is error  # its own words, for the log
    assert stream.logprobs == sent_scores(CHUNKS[:k])
    # Nothing after the end, whatever comes.
    assert translator.feed(sse(CHUNKS[k:])) == b"" and translator.finish() == b"" and translator.fail(error) == b""



def test_break_after_the_finish_completes_even_mid_frame() -> None:
    """The connection breaks inside the usage frame that follows the finish: the generation
    is whole, so the response completes with every score; the cut frame is not read."""
    chunks = Generation(SEED).chunks()
    cut = sse(chunks[:-1], done=False) + frame(chunks[-1])[:25]
    translator, events = translate(plan(), [cut], finish=False)
    stream = check_stream([*events, *parse_sse(translator.fail(UpstreamTimeout("gone")))])
    assert stream.terminal == "response.completed"
    assert stream.logprobs == sent_scores(chunks)


def test_flat_sglang_error_body_as_a_frame_fails_with_its_message() -> None:
    chunks = Generation(SEED).chunks()
    flat = frame({"object": "error", "message": "context too long", "type": "BadRequestError", "param": None, "code": 400})
    _, events = translate(plan(), [sse(chunks[:2], done=False) + flat])
    stream = check_stream(events)
    assert stream.terminal == "response.failed"
    assert stream.events[-2]["message"] == stream.events[-1]["response"]["error"]["message"] == "context too long"
    assert stream.logprobs == sent_scores(chunks[:2])


def test_a_continuing_response_begins_its_id_as_its_chains() -> None:
    """design.md 9.4: `resp_` and the previous response's 8 hex digits, then its own random ones;
    a response that continues none, or an id of another shape, begins its own."""
    previous = "resp_0123abcd" + "f" * 24
    continuing = response_id({"previous_response_id": previous})
    assert continuing[:13] == previous[:13] and continuing != previous and len(continuing) == len(previous)
    assert len({response_id({"previous_response_id": previous})[13:] for _ in range(50)}) == 50
    for other in (None, "chatcmpl-x", "resp_1"):
        assert not response_id({"previous_response_id": other}).startswith(previous[:13])
