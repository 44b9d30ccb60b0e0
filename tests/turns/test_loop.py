"""Every case of a turn's loop (design.md 2.3), driven as a transport drives it: planned, then
`Turn.run(sink)` into an in-memory sink, its upstream scripted (`tests/turns/scripted.py`), its MCP
server the SDK's own on loopback, its store a SQLite file. The transports keep their own tests
(tests/test_streaming.py, test_nonstreaming.py, test_background.py, test_websocket*.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from proxy.errors import ContextLengthExceeded, UpstreamUnreachable
from proxy.metrics import Metrics
from proxy.runtime import Runtime
from proxy.sink import Client, Steered
from proxy.store import StoredConversation
from proxy.turns.rounds import Asks
from tests.client import LOGPROBS, validate_event, validate_response
from tests.events import check_stream, sent_scores
from tests.fake_upstream import Generation, Step, score
from tests.harness import config
from tests.mcp_servers import ToolServer
from tests.turns.scripted import Refused, Silent, Sink, Streamed, Upstream, Whole, planned

Seam = Callable[..., Awaitable[tuple[Runtime, Upstream]]]
SUMMARY = "The user asked for 2 + 3; it is 5."
# An answer of many chunks, read one a time: a client can leave, or steer, amid it.
LONG = Generation([*(Step("text", f"word{n} ", [score(f"word{n}")]) for n in range(12)), Step("finish", finish_reason="stop")])


def calling(name: str, arguments: str, completion_tokens: int | None = None) -> Generation:
    steps = [Step("tool", arguments, [score(arguments)], tool_id="call_1", tool_name=name)]
    finish = Step("finish", finish_reason="tool_calls", scores=[score("<call>")])
    return Generation([*steps, finish], completion_tokens=completion_tokens)


def answering(text: str, prompt_tokens: int = 7) -> Generation:
    steps = [Step("text", text, [score(text)]), Step("finish", finish_reason="stop", scores=[score("<eos>")])]
    return Generation(steps, prompt_tokens=prompt_tokens)


def mcp(tool_server: ToolServer, **fields: Any) -> dict[str, Any]:
    return {"type": "mcp", "server_label": "calc", "server_url": tool_server.url, "require_approval": "never", **fields}


def reply(generation: Generation, stream: bool) -> Streamed | Whole:
    return Streamed(generation) if stream else Whole(generation)


def plain(response: dict[str, Any] | None) -> dict[str, Any]:
    """A Response as its client reads its JSON (scores are pre-encoded fragments)."""
    assert response is not None
    return dict(orjson.loads(orjson.dumps(response)))


@pytest.fixture
async def seam(tmp_path: Path) -> AsyncIterator[Seam]:
    """`await seam(**config)`: a runtime as the proxy builds one for `config` (a SQLite store of
    its own), its upstream client replaced by a scripted one."""
    runtimes: list[Runtime] = []

    async def start(**top: Any) -> tuple[Runtime, Upstream]:
        runtime = Runtime(config("http://127.0.0.1:9", store={"url": f"sqlite:{tmp_path}/responses.db"}, **top), Metrics())
        runtimes.append(runtime)
        for client in runtime.clients.values():
            await client.close()
        upstream = Upstream()
        runtime.clients = {"default": upstream}  # type: ignore[dict-item]
        return runtime, upstream

    yield start
    for runtime in runtimes:
        await runtime.close()


async def stored(runtime: Runtime, id: str) -> dict[str, Any] | None:
    assert runtime.store is not None
    kept = await runtime.store.get(id, "")
    return None if kept is None else dict(orjson.loads(bytes(kept.response)))


async def test_an_answer_is_one_round_kept_before_its_last_event(seam: Seam) -> None:
    runtime, upstream = await seam()
    answer = answering("Hello world")
    upstream.script(Streamed(answer))
    turn = await planned(runtime, {"model": "m", "input": "hi", "stream": True, "include": LOGPROBS})
    id = turn.translator.progress()["id"]
    sink = Sink(at_end=lambda: stored(runtime, id))
    response = plain(await turn.run(sink))

    stream = check_stream(sink.events)
    assert (stream.terminal, stream.text, stream.response) == ("response.completed", "Hello world", response)
    assert stream.logprobs == sent_scores(answer.chunks())
    (exchange,) = upstream.exchanges
    assert sink.opened_with == [exchange.deadline]  # once, when the upstream answered
    assert sink.seen_at_end == response  # kept before its terminal event left (9.2)
    assert exchange.drained and exchange.closed


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_tool_round_runs_its_mcp_call_then_the_model_answers(seam: Seam, tool_server: ToolServer, stream: bool) -> None:
    runtime, upstream = await seam(mcp={"allowed_servers": [tool_server.url]})
    upstream.script(reply(calling("calc__add", '{"a": 2, "b": 3}'), stream), reply(answering("It is 5."), stream))
    body = {"model": "m", "input": "What is 2 + 3?", "tools": [mcp(tool_server)], "stream": stream}
    sink = Sink()
    response = plain(await (await planned(runtime, body)).run(sink))

    assert [item["type"] for item in response["output"]] == ["mcp_list_tools", "mcp_call", "message"]
    call = response["output"][1]
    assert (call["name"], call["arguments"], call["output"], call["status"]) == ("add", '{"a": 2, "b": 3}', "5", "completed")
    assert tool_server.calls == [("add", {"a": 2, "b": 3})]
    (_, first), (_, second) = upstream.requests
    said, result = second["messages"][-2:]
    assert said["tool_calls"][0]["id"] == call["id"]
    assert result == {"role": "tool", "tool_call_id": call["id"], "content": "5"}
    assert second["messages"][:-2] == first["messages"]
    assert upstream.open_at_post == [0, 0]  # each round's call over before the next is made
    assert len(sink.opened_with) == 1  # by the first round alone
    if stream:
        assert check_stream(sink.events).response == response
    else:
        assert b"".join(sink.writes) == b""  # a whole answer makes no events
    assert await stored(runtime, response["id"]) == response


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_search_round_loads_what_it_found_into_the_next_round(seam: Seam, stream: bool) -> None:
    """The proxy's tool search (8.17) is a call it runs after the round, within the budget of
    calls: its items, then the next round offered the tools it found."""
    runtime, upstream = await seam()
    upstream.script(reply(calling("tool_search", '{"query": "convert a currency"}'), stream), reply(answering("1 EUR is 1.1 USD."), stream))
    rates = {"type": "function", "name": "convert", "description": "Convert an amount between currencies.", "defer_loading": True}
    body = {"model": "m", "input": "1 EUR in USD?", "tools": [rates, {"type": "tool_search"}], "stream": stream, "max_tool_calls": 3}
    turn = await planned(runtime, body)
    sink = Sink()
    response = plain(await turn.run(sink))

    assert [item["type"] for item in response["output"]] == ["tool_search_call", "tool_search_output", "message"]
    assert [tool["name"] for tool in response["output"][1]["tools"]] == ["convert"]
    (_, first), (_, second) = upstream.requests
    assert [tool["function"]["name"] for tool in first["tools"]] == ["tool_search"]
    assert [tool["function"]["name"] for tool in second["tools"]] == ["tool_search", "convert"]
    assert second["messages"][-1] == {"role": "tool", "tool_call_id": "call_1", "content": "Tools loaded, now callable: convert."}
    assert turn.tools.left == 2 and upstream.open_at_post == [0, 0]
    if stream:
        assert check_stream(sink.events).response == response
    assert await stored(runtime, response["id"]) == response


async def test_a_call_that_needs_approval_ends_the_response_for_the_client(seam: Seam, tool_server: ToolServer) -> None:
    runtime, upstream = await seam(mcp={"allowed_servers": [tool_server.url]})
    upstream.script(Streamed(calling("calc__add", '{"a": 2, "b": 3}')))
    body = {"model": "m", "input": "What is 2 + 3?", "tools": [mcp(tool_server, require_approval="always")], "stream": True}
    sink = Sink()
    response = plain(await (await planned(runtime, body)).run(sink))

    assert [item["type"] for item in response["output"]] == ["mcp_list_tools", "mcp_approval_request"]
    assert response["status"] == "completed" and check_stream(sink.events).response == response
    assert tool_server.calls == [] and len(upstream.requests) == 1  # owed to the client: nothing more runs


async def test_output_tokens_spent_by_a_tool_round_end_the_response_incomplete(seam: Seam, tool_server: ToolServer) -> None:
    runtime, upstream = await seam(mcp={"allowed_servers": [tool_server.url]})
    upstream.script(Streamed(calling("calc__add", '{"a": 2, "b": 3}', completion_tokens=12)))
    body = {"model": "m", "input": "2 + 3?", "tools": [mcp(tool_server)], "stream": True, "max_output_tokens": 12}
    sink = Sink()
    response = plain(await (await planned(runtime, body)).run(sink))

    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert [item["type"] for item in response["output"]] == ["mcp_list_tools", "mcp_call"]
    assert tool_server.calls == [("add", {"a": 2, "b": 3})] and len(upstream.requests) == 1  # no round is left tokens
    assert check_stream(sink.events).terminal == "response.incomplete"


async def test_a_turn_past_its_threshold_ends_with_the_summary_as_a_compaction_item(seam: Seam) -> None:
    runtime, upstream = await seam()
    upstream.script(Streamed(answering("It is 5.", prompt_tokens=200)), Whole(answering(SUMMARY)))
    body = {"model": "m", "input": "2 + 3?", "stream": True, "context_management": [{"type": "compaction", "compact_threshold": 100}]}
    sink = Sink()
    response = plain(await (await planned(runtime, body)).run(sink))

    assert [item["type"] for item in response["output"]] == ["message", "compaction"]
    (_, answered), (_, summary) = upstream.requests
    assert summary["stream"] is False and summary["messages"][:-2] == answered["messages"]
    said = summary["messages"][-2]  # the answer, then the prompt
    assert (said["role"], said["content"]) == ("assistant", "It is 5.")
    events = sink.events  # the message closes before the compaction item: not check_stream's order
    for event in events:
        validate_event(event)
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    kinds = [event["type"] for event in events]
    assert kinds[-4:] == ["response.output_item.added", "response.compaction.compacting", "response.output_item.done", "response.completed"]
    assert plain(events[-1]["response"]) == response
    assert response["usage"]["input_tokens"] == 200 + 7  # the answer's and the summary's


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
async def test_a_compaction_trigger_turn_is_its_summary(seam: Seam, stream: bool) -> None:
    runtime, upstream = await seam()
    upstream.script(Whole(answering(SUMMARY)))
    body = {"model": "m", "input": [{"role": "user", "content": "2 + 3?"}, {"type": "compaction_trigger"}], "stream": stream}
    turn = await planned(runtime, body)
    assert turn.asks is Asks.SUMMARY
    sink = Sink()
    response = plain(await turn.run(sink))

    ((_, summary),) = upstream.requests  # its one round, the summary's
    assert summary["stream"] is False and summary["messages"][-1]["role"] == "user"
    (item,) = response["output"]
    assert item["type"] == "compaction" and response["status"] == "completed"
    assert sink.opened_with == [None]  # before the summary's call, whose item it shows (8.8)
    if stream:
        assert check_stream(sink.events).response == response
    assert await stored(runtime, response["id"]) == response


@pytest.mark.parametrize(
    ("client", "status", "code"),
    [(Client.WAITING, "cancelled", None), (Client.STOPPING, "failed", "server_error")],
    ids=["cancelled", "stopping"],
)
async def test_a_cancel_between_rounds_ends_the_response_as_its_client_takes_it(
    seam: Seam, tool_server: ToolServer, client: Client, status: str, code: str | None
) -> None:
    """A background run's log waits for the end: its Response ends with the rounds done, the
    call that did not finish `incomplete` (10.3); a proxy stopping fails it, for a retry."""
    runtime, upstream = await seam(mcp={"allowed_servers": [tool_server.url]})
    upstream.script(Streamed(calling("calc__sleep", '{"seconds": 30}')))
    body = {"model": "m", "input": "wait", "tools": [mcp(tool_server)], "stream": True, "background": True}
    turn = await planned(runtime, body)
    sink = Sink(client)
    running = asyncio.create_task(turn.run(sink))
    async with asyncio.timeout(10):
        while not tool_server.sleeping:  # between rounds: its call runs
            await asyncio.sleep(0.01)
    running.cancel()
    response = plain(await running)

    assert (response["status"], (response["error"] or {}).get("code")) == (status, code)
    assert [(item["type"], item["status"]) for item in response["output"][1:]] == [("mcp_call", "incomplete")]
    events = sink.events  # a cancelled Response ends with `response.failed` (10.3): not check_stream's rule
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["type"] == "response.failed" and plain(events[-1]["response"]) == response
    assert events[0]["response"]["status"] == "queued"  # its log shows it before the upstream answers (10.1)
    assert sink.opened_with == [upstream.exchanges[0].deadline] and len(upstream.requests) == 1


async def test_a_client_gone_while_the_summary_is_made_leaves_the_answer_kept(seam: Seam) -> None:
    """Between rounds, an answer whole (its compaction due) is kept, completed, its compaction
    item empty (8.10); the cancel goes on."""
    runtime, upstream = await seam()
    upstream.script(Streamed(answering("It is 5.", prompt_tokens=200)), Silent())
    body = {"model": "m", "input": "2 + 3?", "stream": True, "context_management": [{"type": "compaction", "compact_threshold": 100}]}
    turn = await planned(runtime, body)
    id = turn.translator.progress()["id"]
    running = asyncio.create_task(turn.run(Sink()))
    async with asyncio.timeout(10):
        while len(upstream.requests) < 2:  # the summary asked
            await asyncio.sleep(0.01)
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    kept = await stored(runtime, id)
    assert kept is not None and kept["status"] == "completed"
    assert [(item["type"], item.get("encrypted_content")) for item in kept["output"]] == [("message", None), ("compaction", "")]


async def test_an_upstream_refusal_mid_loop_fails_the_response_with_the_rounds_done(seam: Seam, tool_server: ToolServer) -> None:
    runtime, upstream = await seam(mcp={"allowed_servers": [tool_server.url]})
    upstream.script(Streamed(calling("calc__add", '{"a": 2, "b": 3}')), Refused(UpstreamUnreachable("upstream default: refused")))
    body = {"model": "m", "input": "2 + 3?", "tools": [mcp(tool_server)], "stream": True}
    sink = Sink()
    response = plain(await (await planned(runtime, body)).run(sink))

    assert response["status"] == "failed" and response["error"]["code"] == "server_error"
    assert "refused" not in response["error"]["message"]  # the upstream's own words are for the log (5.7)
    assert [(item["type"], item["status"]) for item in response["output"][1:]] == [("mcp_call", "completed")]
    assert check_stream(sink.events).response == response
    assert await stored(runtime, response["id"]) == response


async def test_a_refusal_of_the_first_round_is_the_transports_to_answer_unless_read_from_the_events(seam: Seam) -> None:
    """Before any event, an error is answered by the transport (an HTTP status, an error frame);
    one its client acts on from `response.failed` (8.7) is a stream of its own."""
    runtime, upstream = await seam()
    upstream.script(Refused(UpstreamUnreachable("upstream default: refused")))
    sink = Sink()
    with pytest.raises(UpstreamUnreachable):
        await (await planned(runtime, {"model": "m", "input": "hi", "stream": True})).run(sink)
    assert sink.opened_with == [] and sink.writes == []

    upstream.script(Refused(ContextLengthExceeded("too long", param="input")))
    response = plain(await (await planned(runtime, {"model": "m", "input": "hi", "stream": True})).run(sink))
    assert response["status"] == "failed" and response["error"]["code"] == "context_length_exceeded"
    assert sink.opened_with == [None] and check_stream(sink.events).response == response


async def test_a_client_gone_mid_stream_leaves_nothing_kept_and_the_upstream_call_left(seam: Seam) -> None:
    """A write that finds its client gone ends the turn (9.2: a stream cut short is not kept);
    leaving the upstream call closes it, which stops the generation (4.10)."""
    runtime, upstream = await seam()
    upstream.script(Streamed(LONG, pieces=len(LONG.steps)))
    turn = await planned(runtime, {"model": "m", "input": "hi", "stream": True})
    id = turn.translator.progress()["id"]
    with pytest.raises(ConnectionResetError):
        await turn.run(Sink(fail_at=2, raising=ConnectionResetError()))
    (exchange,) = upstream.exchanges
    assert exchange.closed and exchange.reads and not exchange.drained  # left before its end
    assert await stored(runtime, id) is None


async def test_a_steer_stops_the_response_at_the_writes_boundary(seam: Seam) -> None:
    """A sink whose client steered raises it from a write: the Response ends `incomplete`
    there, kept (8.14)."""
    runtime, upstream = await seam()
    upstream.script(Streamed(LONG, pieces=len(LONG.steps)))
    sink = Sink(fail_at=3, raising=Steered())
    response = plain(await (await planned(runtime, {"model": "m", "input": "hi", "stream": True})).run(sink))
    assert response["status"] == "incomplete" and response["incomplete_details"] == {"reason": "steered"}
    validate_response(response)
    assert check_stream(sink.events).response == response
    assert await stored(runtime, response["id"]) == response


async def test_a_conversation_that_does_not_take_the_turn_leaves_its_response_whole(
    seam: Seam, caplog: pytest.LogCaptureFixture
) -> None:
    """Its hold taken by another writer meanwhile (9.7): the items are not added, which is
    logged, and the Response goes out and is kept all the same (one rule for every transport)."""
    runtime, upstream = await seam()
    store = runtime.store
    assert store is not None
    await store.keep_conversation(StoredConversation("conv_1", "", 0, {}, []))
    upstream.script(Streamed(answering("Hello")))
    turn = await planned(runtime, {"model": "m", "input": "hi", "stream": True, "conversation": "conv_1"})
    held = turn.keeping.conversation
    assert held is not None
    await store.let_go("conv_1", held._holder)
    assert await store.hold("conv_1", "", "another writer", 30)
    with caplog.at_level(logging.ERROR, "proxy"):
        response = plain(await turn.run(Sink()))

    assert response["status"] == "completed" and await stored(runtime, response["id"]) == response
    conversation = await store.conversation("conv_1", "")
    assert conversation is not None and conversation.items == []
    assert [record.getMessage() for record in caplog.records if record.levelno == logging.ERROR] == [
        f"response {response['id']} was not added to its conversation: The conversation 'conv_1' is held by another writer."
    ]
