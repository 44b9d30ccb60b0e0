"""What agent clients read, from the translator: namespaced and custom tool calls, reasoning
summaries, sealed reasoning (design.md 8.3-8.6), with the score contract intact. No I/O."""

from __future__ import annotations

import orjson
import pytest

from proxy.responses.sealing import Sealer, derive_key
from tests.agents import namespace
from tests.events import check_stream, completed, plan, sent_scores, sse, tokens, translate
from tests.fake_upstream import Generation, Step, score

SEALER = Sealer(derive_key("test key"))
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.", "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}
PATCH = '*** Begin Patch\n*** Add File: a.txt\n+"hi"\n*** End Patch\n'


def tool_step(text: str, name: str | None = None, call_id: str | None = None, *scores: str, index: int = 0) -> Step:
    return Step("tool", text, [score(s) for s in scores], tool_index=index, tool_id=call_id, tool_name=name)


def events_of(stream, kind: str) -> list[dict]:
    return [event for event in stream.events if event["type"] == kind]


@pytest.mark.parametrize("dialect", ["sglang", "vllm"])
def test_a_namespaced_call_comes_back_with_name_and_namespace_apart(dialect: str) -> None:
    call = plan(tools=[{"type": "function", "name": "wait_agent", "parameters": {}}, namespace("multi_agent_v1", "wait_agent")])
    gen = Generation(
        [
            Step("text", "Waiting.", [score("Waiting.")]),
            tool_step('{"x":', "multi_agent_v1__wait_agent", "c1", "{"),
            tool_step('"y"}', None, None, "y"),
            tool_step("{}", "wait_agent", "c2", "{}", index=1),
            Step("finish", finish_reason="tool_calls", scores=[score("<eos>")]),
        ],
        dialect=dialect,
    )
    chunks = gen.chunks()
    stream = check_stream(translate(call, [sse(chunks)])[1])
    namespaced, plain = stream.of_type("function_call")
    assert (namespaced["name"], namespaced["namespace"], namespaced["arguments"]) == ("wait_agent", "multi_agent_v1", '{"x":"y"}')
    assert (plain["name"], plain["arguments"]) == ("wait_agent", "{}") and "namespace" not in plain
    added = [e["item"] for e in events_of(stream, "response.output_item.added") if e["item"]["type"] == "function_call"]
    assert [(a["name"], a.get("namespace")) for a in added] == [("wait_agent", "multi_agent_v1"), ("wait_agent", None)]
    assert stream.logprobs == sent_scores(chunks)  # every score, tool tokens included, on the message


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ([orjson.dumps({"input": PATCH}).decode()[:20], orjson.dumps({"input": PATCH}).decode()[20:]], PATCH),
        ([orjson.dumps(PATCH).decode()], PATCH),  # a bare JSON string
        (["*** Begin Patch raw"], "*** Begin Patch raw"),  # the model ignored the schema
    ],
    ids=["as-asked", "json-string", "raw"],
)
def test_a_custom_tool_call_streams_its_input_once_whole(arguments: list[str], expected: str) -> None:
    call = plan(tools=[APPLY_PATCH])
    steps = [tool_step(arguments[0], "apply_patch", "c1", "p1")]
    steps += [tool_step(fragment, None, None, "p2") for fragment in arguments[1:]]
    gen = Generation([*steps, Step("finish", finish_reason="tool_calls")])
    chunks = gen.chunks()
    stream = check_stream(translate(call, [sse(chunks)])[1])
    (item,) = stream.of_type("custom_tool_call")
    assert (item["name"], item["call_id"], item["input"], item["status"]) == ("apply_patch", "c1", expected, "completed")
    assert [e["delta"] for e in events_of(stream, "response.custom_tool_call_input.delta")] == [expected]
    assert [e["input"] for e in events_of(stream, "response.custom_tool_call_input.done")] == [expected]
    assert not events_of(stream, "response.function_call_arguments.delta")
    assert tokens(stream.logprobs) == ["p1", *["p2"] * (len(arguments) - 1)]  # on the empty message (3.9)


def test_a_custom_call_cut_short_is_incomplete_with_what_was_written() -> None:
    call = plan(tools=[APPLY_PATCH])
    gen = Generation([tool_step('{"input": "*** Begin', "apply_patch", "c1", "p"), Step("finish", finish_reason="length")])
    stream = check_stream(translate(call, [sse(gen.chunks())])[1])
    (item,) = stream.of_type("custom_tool_call")
    assert (item["status"], item["input"]) == ("incomplete", '{"input": "*** Begin')
    assert stream.terminal == "response.incomplete"


def test_custom_and_namespaced_calls_in_the_non_streaming_response_match_the_stream() -> None:
    call = plan(tools=[APPLY_PATCH, namespace("team", "weather")])
    gen = Generation([
        Step("reasoning", "hm", [score("hm")]),
        tool_step(orjson.dumps({"input": PATCH}).decode(), "apply_patch", "c1", "p"),
        tool_step("{}", "team__weather", "c2", "w", index=1),
        Step("finish", finish_reason="tool_calls"),
    ])
    stream = check_stream(translate(call, [sse(gen.chunks())])[1])
    whole = completed(call, orjson.dumps(gen.completion()))
    assert whole == stream.response


@pytest.mark.parametrize("summary", [None, "auto", "detailed"])
def test_reasoning_goes_out_as_its_own_summary_when_one_is_asked(summary: str | None) -> None:
    call = plan(reasoning={"summary": summary} if summary else {})
    gen = Generation([Step("reasoning", "Let me ", [score("a")]), Step("reasoning", "think.", [score("b")]), Step("text", "Hi", [score("c")]), Step("finish", finish_reason="stop")])
    stream = check_stream(translate(call, [sse(gen.chunks())])[1])
    (reasoning,) = stream.of_type("reasoning")
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    deltas = [e["delta"] for e in events_of(stream, "response.reasoning_summary_text.delta")]
    if summary is None:
        assert deltas == [] and reasoning["summary"] == []
        assert not [e for e in stream.events if "summary" in e["type"]]
        return
    assert deltas == ["Let me ", "think."]
    assert reasoning["summary"] == [{"type": "summary_text", "text": "Let me think."}]
    kinds = [e["type"] for e in stream.events if e.get("item_id") == reasoning["id"]]
    assert kinds == [
        "response.content_part.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ]
    assert all(e["summary_index"] == 0 for e in stream.events if "summary" in e["type"])


@pytest.mark.parametrize("include", [False, True])
def test_reasoning_is_sealed_for_clients_that_keep_no_state(include: bool) -> None:
    call = plan(sealer=SEALER, include=["reasoning.encrypted_content"] if include else [])
    gen = Generation([Step("reasoning", "secret plan", [score("s")]), Step("text", "Hi", [score("h")]), Step("finish", finish_reason="stop")])
    stream = check_stream(translate(call, [sse(gen.chunks())])[1])
    (reasoning,) = stream.of_type("reasoning")
    if not include:
        assert "encrypted_content" not in reasoning
        return
    blob = reasoning["encrypted_content"]
    assert "secret" not in blob and SEALER.open(blob) == "secret plan"
    assert Sealer(derive_key("another key")).open(blob) is None
