"""Chunks recognised by their shape (design.md 7.4): what the fast path reads is what a full
decode reads, for any text, any scores and every dialect."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.responses.chat import ChunkShape, decode_chunk
from tests.events import plan, sse, translate
from tests.fake_upstream import Generation, Step, score

texts = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6)


def frame_of(chunk: dict) -> bytes:
    return orjson.dumps(chunk)


def shape_of(chunk: dict) -> ChunkShape:
    payload = frame_of(chunk)
    shape = ChunkShape.learn(payload, decode_chunk(payload), True)
    assert shape is not None
    return shape


def text_chunk(text: str, scores: list[dict] | None = None, **delta: object) -> dict:
    return Generation([Step("text", text, scores or [])], id="chatcmpl-1", created=1750000000).chunks(usage=False)[1] | (
        {"choices": [{"index": 0, "delta": {"content": text, **delta}, "logprobs": {"content": scores} if scores else None, "finish_reason": None}]}
        if delta
        else {}
    )


def full_and_fast(chunks: list[dict], logprobs: bool, nl: str = "\n") -> tuple[list[dict], list[dict]]:
    """The events of a stream read with shapes, and without."""
    body = sse(chunks, nl=nl)
    fast = translate(plan(logprobs), [body])[1]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ChunkShape, "learn", classmethod(lambda cls, payload, chunk, scores_wanted: None))
        full = translate(plan(logprobs), [body])[1]
    return fast, full


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.sampled_from(["text", "text", "reasoning", "scores"]), texts, st.integers(0, 2)), max_size=12),
    st.sampled_from(["sglang", "vllm", "llama.cpp"]),
    st.booleans(),
)
def test_the_fast_path_reads_what_a_full_decode_reads(steps: list[tuple[str, str, int]], dialect: str, logprobs: bool) -> None:
    gen = Generation(
        [Step(kind, "" if kind == "scores" else text, [score(text, -0.5, top=top)]) for kind, text, top in steps]
        + [Step("finish", finish_reason="stop")],
        dialect=dialect,  # type: ignore[arg-type]
    )
    fast, full = full_and_fast(gen.chunks(logprobs=logprobs), logprobs)
    assert fast == full


def test_a_stream_of_text_chunks_takes_the_fast_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not vacuous: after the first text chunk, every other one is matched, not decoded."""
    gen = Generation([Step("text", f" w{i}", [score(f" w{i}", top=2)]) for i in range(20)] + [Step("finish", finish_reason="stop")])
    matched = []
    match = ChunkShape.match
    monkeypatch.setattr(ChunkShape, "match", lambda self, payload: matched.append(found := match(self, payload)) or found)
    translate(plan(True), [sse(gen.chunks())])
    assert sum(found is not None for found in matched) == 19


@pytest.mark.parametrize("text", ['"', "\\", 'a\\"b', "\\\\", 'end\\', "é ☃ \n\t", '"}],"usage":null}'])
def test_any_text_is_read_whole(text: str) -> None:
    scores = [score(text, -1.0, top=1)]
    shape = shape_of(text_chunk("first", [score("first", top=1)]))
    payload = frame_of(text_chunk(text, scores))
    assert shape.match(payload) == (text, orjson.dumps(scores))


def test_a_text_with_escapes_of_its_own_is_read_as_it_says() -> None:
    shape = shape_of(text_chunk("first", [score("first")]))
    payload = frame_of(text_chunk("first", [score("x")])).replace(b'"first"', b'"\\u00e9\\/"', 1)
    assert shape.match(payload) == ("é/", orjson.dumps([score("x")]))


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(lambda: text_chunk("a", [score("a")], reasoning_content="r"), id="reasoning too"),
        pytest.param(lambda: text_chunk("a", [score("a")]) | {"usage": {"prompt_tokens": 1, "completion_tokens": 1}}, id="usage"),
        pytest.param(lambda: {**text_chunk("a", [score("a")]), "id": "other"}, id="another head"),
        pytest.param(lambda: text_chunk("a", [score("a")]) | {"choices": [{**text_chunk("a", [score("a")])["choices"][0], "finish_reason": "stop"}]}, id="finish"),
    ],
)
def test_a_chunk_of_another_shape_is_not_matched(other) -> None:
    shape = shape_of(text_chunk("first", [score("first")]))
    assert shape.match(frame_of(other())) is None


def test_bytes_that_only_look_like_the_shape_are_not_matched() -> None:
    shape = shape_of(text_chunk("first", [score("first")]))
    good = frame_of(text_chunk("x", [score("x")]))
    assert shape.match(good) is not None
    head = good[: good.index(b'"x"')]
    assert shape.match(head + b'"unterminated') is None
    assert shape.match(head + b'"a\\"' + good[good.index(b'"x"') + 3 :]) is None  # its quote is escaped: no string ends there
    assert shape.match(head + b"17" + good[good.index(b'"x"') + 3 :]) is None  # not a string


def test_a_text_found_twice_teaches_no_shape() -> None:
    """The text's place must be certain: a chunk whose text also stands elsewhere before the
    scores (here the model's name) is decoded in full, and so is the next."""
    payload = frame_of({**text_chunk("bench", [score("bench")]), "model": "bench"})
    assert ChunkShape.learn(payload, decode_chunk(payload), True) is None


@pytest.mark.parametrize("logprobs", [True, False])
def test_more_than_the_shape_between_its_bytes_is_decoded_in_full(logprobs: bool) -> None:
    """A payload that starts and ends as the shape but holds more in the scores' place (here a
    second choice, after the first choice's finish) is no match: its finish is read."""
    # Scores only where they are asked for: otherwise no shape is learned to be tried.
    first, second = text_chunk("a", [score("a")] if logprobs else None), text_chunk("b", [score("b")] if logprobs else None)
    other = {**second["choices"][0], "index": 1}
    two = {**second, "choices": [{**second["choices"][0], "finish_reason": "length"}, other]}
    fast, full = full_and_fast([first, two], logprobs)
    assert fast == full
    assert fast[-1]["type"] == "response.incomplete"


def test_scores_over_several_lines_go_out_on_one() -> None:
    """A chunk written as a multi-line `data:` field: its scores hold line breaks, which must
    not reach an event (they would end it)."""
    chunks = [text_chunk(w, [score(w, top=2), score(w + "!", top=1)]) for w in ("a", "b", "c")]
    frames = b"".join(b"data: " + orjson.dumps(c, option=orjson.OPT_INDENT_2).replace(b"\n", b"\ndata: ") + b"\n\n" for c in chunks)
    events = translate(plan(True), [frames + b"data: [DONE]\n\n"])[1]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [d["delta"] for d in deltas] == ["a", "b", "c"]
    assert [s["token"] for d in deltas for s in d["logprobs"]] == ["a", "a!", "b", "b!", "c", "c!"]


def test_scores_that_need_mapping_teach_no_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """A shape learned from scores that were mapped (here a null logprob) would send every later
    chunk through the exact check in vain before its full decode: none is learned."""
    tried = []
    match = ChunkShape.match
    monkeypatch.setattr(ChunkShape, "match", lambda self, payload: tried.append(payload) or match(self, payload))
    unmapped = [{**score(w), "logprob": None} for w in "abc"]
    chunks = [text_chunk(w, [entry]) for w, entry in zip("abc", unmapped, strict=True)]
    events = translate(plan(True), [sse(chunks)])[1]
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == ["a", "b", "c"]
    assert tried == []
