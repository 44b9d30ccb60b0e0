"""One Response over several rounds (design.md 2.2, 2.3): a round whose model called a tool the
proxy runs itself (an MCP server's, 14.4) leaves the Response open, the next round's upstream
stream continues it. Over
any chunking of either round, the events keep every contract of one stream (one terminal event,
sequence numbers and output indexes that go on, every score once, in order, on the one message)
and end in the Response a non-streaming run of the same rounds builds."""

from __future__ import annotations

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.responses.mcp import Servers
from proxy.responses.translate import NextRound, ResponseTranslator, RunCalls
from tests.events import REQUEST_ID, check_stream, fixed, parse_sse, plan, sent_scores, split, sse
from tests.fake_upstream import Generation, Step, score

TOOL = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}
# An MCP server with a tool of the same name, which the model is offered as `kb__lookup`.
KB = {"type": "mcp", "server_label": "kb", "server_url": "http://kb.example/mcp", "require_approval": "never"}
LISTED = Servers(tools={"kb": [{"name": "lookup", "input_schema": TOOL["parameters"], "description": "Look it up."}]})
words = st.text(st.characters(whitelist_categories=("L", "Nd", "Zs")), min_size=1, max_size=6)


@st.composite
def two_rounds(draw) -> tuple[Generation, Generation]:
    """A tool round (maybe reasoning and text first, then a call of `lookup`, finished
    `tool_calls`), then an answer (text, finished `stop`), each token scored."""
    first: list[Step] = []
    if draw(st.booleans()):
        first.append(Step("reasoning", draw(words), [score(draw(words))]))
    if draw(st.booleans()):
        first.append(Step("text", draw(words), [score(draw(words))]))
    arguments = orjson.dumps({"q": draw(words)}).decode()
    cut = draw(st.integers(1, len(arguments) - 1))
    first += [
        Step("tool", arguments[:cut], [score("{")], tool_index=0, tool_id="call_1", tool_name="kb__lookup"),
        Step("tool", arguments[cut:], [score("}")], tool_index=0),
        Step("finish", finish_reason="tool_calls", scores=[score("<call-end>")]),
    ]
    answer = [Step("text", draw(words), [score(draw(words))]) for _ in range(draw(st.integers(1, 4)))]
    answer.append(Step("finish", finish_reason="stop", scores=[score("<eos>")]))
    dialect = draw(st.sampled_from(["sglang", "vllm"]))
    return Generation(first, dialect=dialect), Generation(answer, dialect=dialect)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(two_rounds(), st.data())
def test_a_tool_round_then_an_answer_is_one_response(rounds: tuple[Generation, Generation], data) -> None:
    call = plan(tools=[TOOL, KB], servers=LISTED)
    translator = ResponseTranslator(call, **fixed(), request_id=REQUEST_ID)
    out = [translator.start()]
    for n, generation in enumerate(rounds):
        if n:
            due = translator.due()  # not the client's to answer: its calls are the proxy's to run
            assert translator.round_over and translator.response is None and isinstance(due, RunCalls)
            [ran] = due.calls
            assert (ran["name"], ran["server_label"]) == ("lookup", "kb")
            out.append(translator.ran({ran["id"]: ("found", None)}))
            after = translator.due()
            assert isinstance(after, NextRound)
            assert after.messages[0]["tool_calls"][0]["id"] == ran["id"]  # its tool message answers it
            assert after.messages[1] == {"role": "tool", "tool_call_id": ran["id"], "content": "found"}
            translator.next_round()
        body = sse(generation.chunks())
        out += [translator.feed(piece) for piece in split(body, data.draw(st.lists(st.integers(0, len(body)), max_size=8)))]
        out.append(translator.finish())
    assert not translator.round_over and translator.response is not None
    stream = check_stream(parse_sse(b"".join(out)))  # one terminal event, numbers 0.. without a gap

    assert stream.terminal == "response.completed"
    first = [step.kind for step in rounds[0].steps]
    opened = ["reasoning"] * ("reasoning" in first) + ["message"] * ("text" in first) + ["mcp_call"]
    assert [item.type for item in stream.items] == opened + ["message"] * ("text" not in first)  # one message
    assert stream.logprobs == sent_scores(rounds[0].chunks()) + sent_scores(rounds[1].chunks())
    streamed = [s for _, scores in stream.deltas for s in scores]
    assert streamed == stream.logprobs[: len(streamed)]  # each once, in order, the rest on the done events
    assert stream.text == "".join(step.text for generation in rounds for step in generation.steps if step.kind == "text")
    usage = stream.response["usage"]  # the rounds' together
    assert usage["input_tokens"] == sum(generation.usage()["prompt_tokens"] for generation in rounds)
    assert usage["output_tokens"] == sum(generation.usage()["completion_tokens"] for generation in rounds)
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]

    # The same rounds, whole.
    whole = ResponseTranslator(call, streaming=False, **fixed())
    assert whole.complete(orjson.dumps(rounds[0].completion())) is None and whole.round_over
    due = whole.due()
    assert isinstance(due, RunCalls)
    whole.ran({due.calls[0]["id"]: ("found", None)})
    whole.next_round()
    answered = orjson.loads(orjson.dumps(whole.complete(orjson.dumps(rounds[1].completion()))))
    assert answered == stream.response


def test_a_round_that_calls_only_the_clients_tools_ends_the_response() -> None:
    """A call of the client's own function ends the Response for the client to run, as ever."""
    call = plan(tools=[TOOL, KB], servers=LISTED)
    translator = ResponseTranslator(call, **fixed(), request_id=REQUEST_ID)
    generation = Generation([Step("tool", '{"q": "x"}', [score("{")], tool_index=0, tool_id="call_1", tool_name="lookup"),
                             Step("finish", finish_reason="tool_calls")])
    events = parse_sse(translator.start() + translator.feed(sse(generation.chunks())) + translator.finish())
    assert not translator.round_over and check_stream(events).terminal == "response.completed"
