"""openai-agents (Python, in this process): `Runner.run_streamed` with a function tool, its
WebSocket transport and its compaction, through the proxy."""

from __future__ import annotations

import json

import aiohttp
import openai
from agents import (
    Agent,
    ModelSettings,
    OpenAIConversationsSession,
    OpenAIResponsesCompactionSession,
    OpenAIResponsesModel,
    OpenAIResponsesWSModel,
    Runner,
    SQLiteSession,
    function_tool,
    set_tracing_disabled,
)

from proxy.responses.compaction import HEAD, PROMPT
from tests.e2e.model import answers, calls, script, tool_round
from tests.fake_upstream import FakeUpstream

THOUGHT = "Paris: the weather tool knows."
ANSWER = "It is 21C in Paris."


@function_tool
def weather(city: str) -> str:
    """Get the weather for a city."""
    return f"21C in {city}"


def weather_agent(model: OpenAIResponsesModel) -> Agent:
    return Agent(name="assistant", instructions="You are a helpful assistant.", model=model, tools=[weather])


async def test_streamed_function_tool_round_trip(upstream: FakeUpstream, proxy: str) -> None:
    script(upstream, calls("get_weather", {"city": "Paris"}, "call_w", reasoning=THOUGHT), answers(ANSWER))
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Get the weather for a city."""
        asked.append(city)
        return f"21C in {city}"

    set_tracing_disabled(True)  # else the SDK posts traces to api.openai.com
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        model = OpenAIResponsesModel(model="qwen3", openai_client=client)
        agent = Agent(name="assistant", instructions="You are a helpful assistant.", model=model, tools=[get_weather])
        result = Runner.run_streamed(agent, "What is the weather in Paris?")
        named = [event.name async for event in result.stream_events() if event.type == "run_item_stream_event"]

    assert asked == ["Paris"]
    assert result.final_output == ANSWER
    assert named == ["reasoning_item_created", "tool_called", "tool_output", "message_output_created"]
    assert [item.type for item in result.new_items] == ["reasoning_item", "tool_call_item", "tool_call_output_item", "message_output_item"]
    assistant, tool = tool_round(upstream)
    [call] = assistant["tool_calls"]
    assert (call["function"]["name"], json.loads(call["function"]["arguments"])) == ("get_weather", {"city": "Paris"})
    assert tool["content"] == "21C in Paris"
    assert assistant.get("reasoning_content") == THOUGHT, assistant  # replayed from the reasoning item's content


async def test_auto_previous_response_id_chains_through_the_store(upstream: FakeUpstream, proxy: str) -> None:
    """With `auto_previous_response_id`, the SDK's second request carries only the tool's
    result and the first response's id: the proxy rebuilds the turn from its store."""
    script(upstream, calls("weather", {"city": "Paris"}, "call_w", reasoning=THOUGHT), answers(ANSWER))

    set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        agent = weather_agent(OpenAIResponsesModel(model="qwen3", openai_client=client))
        result = Runner.run_streamed(agent, "What is the weather in Paris?", auto_previous_response_id=True)
        async for _ in result.stream_events():
            pass
        first, last = (response.response_id for response in result.raw_responses)
        stored = await client.responses.retrieve(last)

    assert result.final_output == ANSWER
    assert stored.previous_response_id == first  # the client chained, it did not resend
    first_turn = upstream.requests[0]["messages"]
    assistant, tool = tool_round(upstream)
    assert upstream.requests[1]["messages"][: len(first_turn)] == first_turn  # the history, rebuilt
    assert tool["content"] == "21C in Paris" and assistant.get("reasoning_content") == THOUGHT


async def test_a_tool_round_over_the_websocket_transport(upstream: FakeUpstream, proxy: str) -> None:
    """design.md 8.9: openai-agents' websocket transport: a tool round, both turns on one
    connection."""
    script(upstream, calls("weather", {"city": "Paris"}, "call_w", reasoning=THOUGHT), answers(ANSWER))

    set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        model = OpenAIResponsesWSModel(model="qwen3", openai_client=client)
        result = Runner.run_streamed(weather_agent(model), "What is the weather in Paris?")
        async for _ in result.stream_events():
            pass
        await model.close()
    async with aiohttp.ClientSession() as http, http.get(f"{proxy}/metrics") as metrics:
        text = await metrics.text()

    assert result.final_output == ANSWER
    assistant, tool = tool_round(upstream)
    assert tool["content"] == "21C in Paris" and assistant.get("reasoning_content") == THOUGHT
    # One request to /v1/responses carried both turns: the WebSocket (101, or 499 when the
    # connection's end cancels the handler before it returns).
    served = [line for line in text.splitlines() if line.startswith('proxy_requests_total{endpoint="/v1/responses"')]
    assert len(served) == 1 and served[0].endswith(" 1.0") and len(upstream.requests) == 2, text


async def test_the_compaction_session_compacts_through_the_proxy(upstream: FakeUpstream, proxy: str, tmp_path) -> None:
    """design.md 8.8: `OpenAIResponsesCompactionSession` (model names as OpenAI's: gpt-oss on
    a chat server) calls /v1/responses/compact after a turn and keeps its output as the
    session's history; the next turn starts from the summary."""
    summary = "The user asked for the weather in Paris; it is 21C."
    script(upstream, calls("weather", {"city": "Paris"}, "call_w"), answers(ANSWER), summary)
    set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        agent = weather_agent(OpenAIResponsesModel(model="gpt-oss-20b", openai_client=client))
        session = OpenAIResponsesCompactionSession(
            "e2e", SQLiteSession("e2e", str(tmp_path / "session.db")), client=client, model="gpt-oss-20b", should_trigger_compaction=lambda _: True
        )
        first = await Runner.run(agent, "What is the weather in Paris?", session=session)
        kept = await session.get_items()
        then = await Runner.run(agent, "And tomorrow?", session=session)

    assert first.final_output == ANSWER and then.final_output == ANSWER
    assert [item.get("type") for item in kept][-1] == "compaction", kept
    assert any(r["messages"][-1]["content"] == PROMPT for r in upstream.requests)
    last = [m for r in upstream.requests if r["messages"][-1]["content"] == "And tomorrow?" for m in r["messages"]]
    assert {"role": "user", "content": HEAD + summary} in last, last


async def test_context_management_in_the_model_settings(upstream: FakeUpstream, proxy: str) -> None:
    """design.md 8.10: openai-agents' `context_management` setting; the turn past its threshold
    ends with a compaction item, which the SDK's next step sends back."""
    script(upstream, calls("weather", {"city": "Paris"}, "call_w"), answers(ANSWER), "A summary.")
    set_tracing_disabled(True)
    settings = ModelSettings(context_management=[{"type": "compaction", "compact_threshold": 5}])
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        agent = weather_agent(OpenAIResponsesModel(model="qwen3", openai_client=client)).clone(model_settings=settings)
        result = await Runner.run(agent, "What is the weather in Paris?")

    assert result.final_output == ANSWER
    assert [item.type for item in result.raw_responses[0].output] == ["function_call", "compaction"]
    second = next(r for r in upstream.requests if any(m["role"] == "tool" for m in r["messages"]))
    assert {"role": "user", "content": HEAD + "A summary."} in second["messages"], second


async def test_a_conversations_session_keeps_the_history_in_the_proxy(upstream: FakeUpstream, proxy: str) -> None:
    """design.md 9.7: `OpenAIConversationsSession` makes a conversation, reads its items before
    each run and adds the run's; the second run's model sees the first."""
    script(upstream, answers(ANSWER), answers(ANSWER))
    set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        agent = weather_agent(OpenAIResponsesModel(model="qwen3", openai_client=client))
        session = OpenAIConversationsSession(openai_client=client)
        await Runner.run(agent, "What is the weather in Paris?", session=session)
        second = await Runner.run(agent, "And in Rome?", session=session)
        items = await client.conversations.items.list(await session._get_session_id(), order="asc")

    assert second.final_output == ANSWER
    said = [m["content"] for m in upstream.requests[-1]["messages"] if m["role"] != "system"]
    assert said == ["What is the weather in Paris?", ANSWER, "And in Rome?"]
    assert len(items.data) == 4


async def test_runs_on_a_server_conversation(upstream: FakeUpstream, proxy: str) -> None:
    """design.md 9.7: `Runner.run(..., conversation_id=...)` sends only the new input with
    `conversation`; the proxy reads the history from it and adds each run's items."""
    script(upstream, calls("weather", {"city": "Paris"}, "call_w"), answers(ANSWER))
    set_tracing_disabled(True)
    async with openai.AsyncOpenAI(base_url=f"{proxy}/v1", api_key="e2e", max_retries=0) as client:
        conversation = await client.conversations.create()
        agent = weather_agent(OpenAIResponsesModel(model="qwen3", openai_client=client))
        result = await Runner.run(agent, "What is the weather in Paris?", conversation_id=conversation.id)
        items = await client.conversations.items.list(conversation.id, order="asc")

    assert result.final_output == ANSWER
    _, tool = tool_round(upstream)  # the tool round rebuilt from the conversation
    assert tool["content"] == "21C in Paris"
    assert [item.type for item in items.data] == ["message", "function_call", "function_call_output", "message"]
