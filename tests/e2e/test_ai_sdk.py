"""The Vercel AI SDK (`ai` 7 + `@ai-sdk/openai` 4): its default multi-step tool loop, with
streamText and generateText, and its server-side compaction, through the proxy."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.responses.compaction import HEAD
from tests.e2e.clients import ai_sdk
from tests.e2e.model import answers, calls, script, tool_round
from tests.fake_upstream import FakeUpstream

THOUGHT = "The user wants the weather in Paris."
PREAMBLE = "Let me check."
ANSWER = "It is 21C in Paris."
# The SDK sends reasoningSummary only for model ids it knows reason; forceReasoning is its
# switch for other servers' reasoning models.
SUMMARY = {"reasoningSummary": "auto", "forceReasoning": True}
# By default (store true) the SDK replays its earlier output as item_reference items, which
# the proxy resolves from its store; with store false it replays the items themselves.
VARIANTS = [
    pytest.param(None, id="defaults"),
    pytest.param({"store": False}, id="store-false"),
    pytest.param(SUMMARY, id="summary"),
    pytest.param({**SUMMARY, "store": False}, id="summary-store-false"),
]


@pytest.mark.parametrize("options", VARIANTS)
@pytest.mark.parametrize("mode", ["stream", "generate"])
async def test_multi_step_tool_loop(node: Path, upstream: FakeUpstream, proxy: str, mode: str, options: dict[str, Any] | None) -> None:
    script(upstream, calls("get_weather", {"city": "Paris"}, "call_w", reasoning=THOUGHT, text=PREAMBLE), answers(ANSWER))

    report = await ai_sdk(node, proxy, mode, options)
    shown = json.dumps(report, indent=1)  # pytest would cut the dict's repr short

    assert report["steps"], shown
    first = report["steps"][0]
    assert first["content"] == ["reasoning", "text", "tool-call", "tool-result"], shown
    assert (first["text"], first["finishReason"]) == (PREAMBLE, "tool-calls"), shown
    assert first["toolCalls"] == [{"toolName": "get_weather", "toolCallId": "call_w", "input": {"city": "Paris"}}], shown
    assert first["toolResults"][0]["output"] == {"city": "Paris", "tempC": 21}, shown
    summarised = "reasoningSummary" in (options or {})
    # The SDK shows reasoning only from summary events (design.md 8.5).
    assert first["reasoningText"] == (THOUGHT if summarised else ""), shown
    assert not report["errors"], shown
    assert len(report["steps"]) == 2, shown
    second = report["steps"][1]
    assert (second["text"], second["finishReason"]) == (ANSWER, "stop"), shown
    assert report["text"] == ANSWER

    assistant, result = tool_round(upstream)
    assert assistant.get("content") == PREAMBLE, assistant
    [call] = assistant["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert json.loads(result["content"]) == {"city": "Paris", "tempC": 21}
    if (options or {}).get("store", True) or summarised:
        # Replayed by reference, or with store false as the proxy's sealed blob (asked for
        # by the SDK for reasoning models); a non-reasoning model's reasoning the SDK drops.
        assert assistant.get("reasoning_content") == THOUGHT, assistant


@pytest.mark.parametrize("options", [pytest.param({}, id="defaults"), pytest.param({"store": False}, id="store-false")])
async def test_server_side_compaction_in_the_tool_loop(node: Path, upstream: FakeUpstream, proxy: str, options: dict[str, Any]) -> None:
    """design.md 8.10: `contextManagement` with a threshold the first step passes: that step
    ends with a compaction item, which the SDK sends back (by reference, or whole), and the
    second step starts from the summary, the tool call it answers moved after it."""
    summary = "The user asked for the weather in Paris; get_weather was called."
    script(upstream, calls("get_weather", {"city": "Paris"}, "call_w"), answers(ANSWER), summary)
    management = {"contextManagement": [{"type": "compaction", "compactThreshold": 5}]}
    report = await ai_sdk(node, proxy, "stream", {**management, **options})
    shown = json.dumps(report, indent=1)

    assert not report["errors"] and report["text"] == ANSWER, shown
    assert report["steps"][0]["content"] == ["tool-call", "custom", "tool-result"], shown  # custom: openai.compaction
    second = next(r for r in upstream.requests if any(m["role"] == "tool" for m in r["messages"]))
    assert [m["role"] for m in second["messages"]] == ["user", "user", "assistant", "tool"], second
    assert second["messages"][1]["content"] == HEAD + summary
