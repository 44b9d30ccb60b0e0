"""The pending-score buffer over any upstream stream, split at any byte (design.md 3.7-3.9, 4)."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.errors import ProxyError
from tests.events import check_stream, completed, expected_deltas, plan, sent_scores, split, sse, translate
from tests.fake_upstream import Generation, Step, score

texts = st.text(st.characters(blacklist_categories=("Cs",)), max_size=4)
scores = st.lists(
    st.builds(
        score,
        texts,
        st.one_of(st.none(), st.floats(-30, 0)),
        top=st.integers(0, 3),
        with_bytes=st.booleans(),
    ),
    max_size=3,
)


@st.composite
def generations(draw) -> Generation:
    """A random upstream script: reasoning, text and logprobs-only chunks in any order, tool
    calls as runs of fragments (id and name on the first; logprobs-only chunks may come
    between fragments, as with SGLang's tool parser), calls one after another; then maybe a
    finish (maybe followed by late logprobs-only chunks)."""
    steps: list[Step] = []
    calls = 0
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["reasoning", "text", "text", "scores", "tool"]))
        if kind != "tool":
            steps.append(Step(kind, "" if kind == "scores" else draw(texts), draw(scores)))
            continue
        for n, fragment in enumerate(draw(st.lists(texts, min_size=1, max_size=3))):
            first = n == 0
            steps.append(Step("tool", fragment, draw(scores), tool_index=calls,
                              tool_id=f"call_{calls}" if first else None, tool_name="f" if first else None))
            if draw(st.booleans()):
                steps.append(Step("scores", scores=draw(scores)))
        calls += 1
    finish = draw(st.sampled_from([None, "stop", "stop", "tool_calls", "length", "content_filter", "abort"]))
    if finish is not None:
        steps.append(Step("finish", scores=draw(scores), finish_reason=finish))
        if finish != "abort":  # nothing after an abort is read
            steps += [Step("scores", scores=draw(scores)) for _ in range(draw(st.integers(0, 2)))]
    return Generation(steps, dialect=draw(st.sampled_from(["sglang", "vllm"])))


TERMINAL = {None: "response.failed", "abort": "response.failed", "length": "response.incomplete",
            "content_filter": "response.incomplete"}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(generations(), st.booleans(), st.booleans(), st.booleans(), st.sampled_from(["\n", "\r\n"]), st.data())
def test_every_score_once_in_order(gen: Generation, logprobs: bool, usage: bool, done: bool, nl: str, data) -> None:
    chunks = gen.chunks(usage=usage)
    body = sse(chunks, done=done, nl=nl)
    pieces = split(body, data.draw(st.lists(st.integers(0, len(body)), max_size=12)))
    call = plan(logprobs)

    stream = check_stream(translate(call, pieces)[1])

    finish = next((s.finish_reason for s in gen.steps if s.kind == "finish"), None)
    assert stream.terminal == TERMINAL.get(finish, "response.completed")
    sent = sent_scores(chunks) if logprobs else []
    # On the deltas exactly as the pending-score buffer says; the rest only on the done events.
    assert stream.deltas == [(text, s if logprobs else []) for text, s in expected_deltas(chunks)]
    assert stream.logprobs == sent
    text = "".join(step.text for step in gen.steps if step.kind == "text")
    assert (stream.message is not None) == bool(text or sent)  # design.md 3.9
    assert (stream.text or "") == text
    arguments = ["".join(s.text for s in gen.steps if s.kind == "tool" and s.tool_index == i) for i in range(len(
        {s.tool_index for s in gen.steps if s.kind == "tool"}))]
    assert [c["arguments"] for c in stream.of_type("function_call")] == arguments
    if usage and stream.terminal != "response.failed":
        assert stream.response["usage"]["output_tokens"] == gen.usage()["completion_tokens"]

    # The same script, not streamed.
    try:
        whole = completed(call, orjson.dumps(gen.completion()))
    except ProxyError:
        assert stream.terminal == "response.failed"
        return
    assert whole["status"] == stream.response["status"]
    parts = [item["content"][0] for item in whole["output"] if item["type"] == "message"]
    assert (parts[0]["logprobs"] if parts else []) == stream.logprobs
    assert (parts[0]["text"] if parts else None) == stream.text
